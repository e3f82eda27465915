"""The store's tables, and the migrations that create and upgrade them.

The table DDL is one text for the SQL backends: SQLite accepts PostgreSQL's type
names (with the matching affinities) and ``TRUE``/``FALSE``, and MySQL's
rewriting fills in what its grammar lacks. What only one backend has (sequences
and functions on PostgreSQL, counters on SQLite, bucket rows on MySQL) is added
by that backend's steps.

Versions and rolling upgrades. ``lw_meta`` keeps the version reached
(``schema_version``) and the oldest version whose clients can still use the
store safely (``compatible_from``). A client opens a store at its own version
or older (upgrading it first), and a newer store whose ``compatible_from`` it
meets: so a step that only adds (an index, or a table or column that older
clients neither read nor need to keep up to date) lets the hosts of a fleet
upgrade one at a time. A step that older clients would misuse (a column they
would leave stale, a function whose arguments changed) sets
`COMPATIBLE_FROM` to its own version, and a client older than that refuses
the store rather than misread it. docs/upgrading.md says the same for
operators.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple

SCHEMA_VERSION: Final = 9

BOOTSTRAP: Final = """CREATE TABLE IF NOT EXISTS {p}lw_meta (
    key TEXT PRIMARY KEY,
    value BIGINT NOT NULL
)"""
"""The one table that exists before any version: it records the version."""

HOLDERS: Final = """CREATE TABLE {p}lw_holders (
        request_id TEXT NOT NULL,
        name TEXT NOT NULL,
        mode TEXT NOT NULL CHECK (mode IN ('S', 'X')),
        session_id TEXT NOT NULL,
        token BIGINT NOT NULL,
        granted_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (name, request_id)
    )"""
"""The held locks: every grant inserts a row and every release deletes it, so each index
on it is written twice per lock (SQLite rebuilds it without a rowid:
`backends/sqlite/backend.py`)."""

HOLDERS_OWNER: Final = (
    "CREATE INDEX IF NOT EXISTS lw_holders_owner ON {p}lw_holders (session_id, request_id)"
)
"""Since version 8 the one index of lw_holders beside its key: a session's locks, and a
request's (every lookup by request names its session too)."""

_TABLES: Final = (
    """CREATE TABLE {p}lw_sessions (
        id TEXT PRIMARY KEY,
        app_id TEXT NOT NULL,
        host TEXT NOT NULL,
        pid BIGINT NOT NULL,
        ttl DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        heartbeat_at DOUBLE PRECISION NOT NULL,
        expired BOOLEAN NOT NULL DEFAULT FALSE
    )""",
    "CREATE INDEX lw_sessions_app ON {p}lw_sessions (app_id)",
    HOLDERS,
    "CREATE INDEX lw_holders_session ON {p}lw_holders (session_id)",
    """CREATE TABLE {p}lw_waiters (
        request_id TEXT NOT NULL,
        name TEXT NOT NULL,
        mode TEXT NOT NULL CHECK (mode IN ('S', 'X')),
        session_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        enqueued_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        PRIMARY KEY (request_id, name)
    )""",
    "CREATE INDEX lw_waiters_name ON {p}lw_waiters (name, seq)",
    "CREATE INDEX lw_waiters_session ON {p}lw_waiters (session_id)",
    """CREATE TABLE {p}lw_permits (
        name TEXT PRIMARY KEY,
        read_permits BIGINT CHECK (read_permits >= 1),
        write_permits BIGINT NOT NULL CHECK (write_permits >= 1)
    )""",
    """CREATE TABLE {p}lw_fences (
        resource TEXT PRIMARY KEY,
        token BIGINT NOT NULL,
        value TEXT,
        updated_at DOUBLE PRECISION NOT NULL
    )""",
)

COMPATIBLE_FROM: Final[Mapping[int, int]] = {1: 1, 2: 2, 3: 2, 4: 2, 6: 5, 7: 5, 8: 5, 9: 9}
"""For each version, the oldest version whose clients can use a store at it safely.

A version left out counts as usable by no older client (the safe default).
Version 2 is not usable by version 1 clients: they would leave a fence's
last write (``written``) behind its token; version 3 adds only an index,
version 4 a column older clients leave NULL (their sessions are judged by
the TTL alone, as before). Version 5 is left out: an older client would
reserve SQLite tokens itself beside the trigger that now moves the counter.
Version 7 adds a counter that older clients do not move: on SQLite and MySQL the
locks they reclaim go uncounted until they upgrade (on PostgreSQL the functions
count, whoever calls them), which only leaves a metric short.
Version 9 is not usable by older clients: on PostgreSQL they would call ``lw_release``
with its old arguments, or put its old body back on connecting.
"""

READ_VERSION: Final = "SELECT value FROM {p}lw_meta WHERE key = 'schema_version'"
READ_META: Final = (
    "SELECT key, value FROM {p}lw_meta WHERE key IN ('schema_version', 'compatible_from')"
)
WRITE_VERSION: Final = (
    "INSERT INTO {p}lw_meta (key, value) VALUES ('schema_version', :version)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
WRITE_COMPATIBLE_FROM: Final = (
    "INSERT INTO {p}lw_meta (key, value) VALUES ('compatible_from', :compatible_from)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)

_STEPS: Final[dict[int, Sequence[str]]] = {
    1: (
        *_TABLES,
        # The server start seen by the last grant: a new one means a restart.
        "INSERT INTO {p}lw_meta (key, value) VALUES ('started', {started})",
    ),
    2: (
        # The token of the last write, apart from the highest token admitted: an access
        # that only reads is refused behind a newer write, not behind a newer reader.
        "ALTER TABLE {p}lw_fences ADD COLUMN written BIGINT NOT NULL DEFAULT 0",
        "UPDATE {p}lw_fences SET written = token",  # as strict as before for old rows
    ),
    3: (
        # Lookups by request (a retried acquire, check, release): without this
        # SQLite went through lw_holders_session, a scan of every lock the
        # session holds, so acquire and release slowed with each lock held.
        "CREATE INDEX IF NOT EXISTS lw_holders_request ON {p}lw_holders (request_id, session_id)",
    ),
    4: (
        # Boot, pid namespace and start time of the session's pid (`process.py`): an
        # acquirer on the same machine sees at once that a holder's process is gone.
        # NULL for sessions of older clients, which only the TTL judges.
        "ALTER TABLE {p}lw_sessions ADD COLUMN pid_start TEXT",
    ),
    5: (),  # SQLite only: its token counter moved by a trigger (`backends/sqlite/backend.py`)
    6: (
        # What administrators did that overrides holders (Store.admin_log): forced
        # release_all, permits raised, locks broken, fences reset.
        """CREATE TABLE {p}lw_admin (
            id TEXT PRIMARY KEY,
            at DOUBLE PRECISION NOT NULL,
            action TEXT NOT NULL,
            subject TEXT NOT NULL,
            detail TEXT NOT NULL,
            host TEXT NOT NULL,
            pid BIGINT NOT NULL
        )""",
        "CREATE INDEX lw_admin_at ON {p}lw_admin (at)",
    ),
    7: (
        # Locks of dead holders that acquirers took over, ever (Store.reclaimed_count):
        # moved by the reclaim's own transaction (`queries.COUNT_RECLAIMED`). Written
        # so that it can run again: MySQL commits each step's statements as they go.
        "INSERT INTO {p}lw_meta (key, value) SELECT 'reclaimed', 0"
        " WHERE NOT EXISTS (SELECT 1 FROM {p}lw_meta WHERE key = 'reclaimed')",
    ),
    8: (
        # One index where there were two (by session; by request and session): a grant
        # and a release each write one index fewer. Older clients only lose the
        # indexes' speed, never a result. Written so that it can run again (MySQL).
        HOLDERS_OWNER,
        "DROP INDEX IF EXISTS {p}lw_holders_session",
        "DROP INDEX IF EXISTS {p}lw_holders_request",
    ),
    # PostgreSQL's release takes the releaser's machine and returns the grants it is to
    # poke (`plpgsql`; the functions follow the library, not this step). No table changes.
    9: (),
}


def steps(version: int, backend_steps: Mapping[int, Sequence[str]]) -> list[str]:
    """The statements that bring a database from ``version - 1`` to ``version``.

    The shared tables first, then what the backend adds for that version.
    """
    return [*_STEPS[version], *backend_steps.get(version, ())]


def compatible_from(version: int) -> int:
    """The oldest version whose clients can use a store at ``version`` (see `COMPATIBLE_FROM`)."""
    return COMPATIBLE_FROM.get(version, version)


class Plan(NamedTuple):
    """What opening a store does to its tables, or would do (``lockwarden init --check``)."""

    url: str
    found: int | None
    """The store's schema version (None: there is no store yet)."""
    usable_from: int | None
    """The oldest version whose clients can use the store (None: no store)."""
    steps: tuple[tuple[int, tuple[str, ...]], ...]
    """The versions to apply, in order, each with its statements."""

    @property
    def refusal(self) -> str | None:
        """Why this lockwarden must not use the store, or None if it may."""
        if self.usable_from is None or self.usable_from <= SCHEMA_VERSION:
            return None
        return (
            f"lock store {self.url} has schema version {self.found}, which lockwarden "
            f"clients older than schema version {self.usable_from} cannot use safely "
            f"(this one has {SCHEMA_VERSION}): upgrade lockwarden on this host"
        )


def plan(
    run: Callable[..., list[dict[str, object]]],
    url: str,
    backend_steps: Mapping[int, Sequence[str]],
    exists: bool = True,
) -> Plan:
    """Read the store's versions with ``run`` and say which steps it still needs.

    A store written before ``compatible_from`` was recorded is taken as usable
    only by its own version and newer, unless this client knows better.
    """
    meta: dict[object, object] = (
        {row["key"]: row["value"] for row in run(READ_META)} if exists else {}
    )
    found = meta.get("schema_version")
    if not isinstance(found, int):
        return Plan(url, None, None, _steps_after(0, backend_steps))
    usable = meta.get("compatible_from")
    if not isinstance(usable, int) or found <= SCHEMA_VERSION:
        usable = compatible_from(found)
    return Plan(url, found, usable, _steps_after(found, backend_steps))


def _steps_after(
    version: int, backend_steps: Mapping[int, Sequence[str]]
) -> tuple[tuple[int, tuple[str, ...]], ...]:
    return tuple(
        (v, tuple(steps(v, backend_steps))) for v in range(version + 1, SCHEMA_VERSION + 1)
    )
