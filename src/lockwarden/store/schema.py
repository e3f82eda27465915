"""The store's tables, and the migrations that create and upgrade them (D1).

The table DDL is one text for both backends: SQLite accepts PostgreSQL's type
names (with the matching affinities) and ``TRUE``/``FALSE``. What only one
backend has (sequences and functions on PostgreSQL, counters on SQLite) is
added by that backend's steps. The version reached is kept in ``lw_meta``; a
database written by a newer lockwarden is refused rather than misread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from lockwarden.errors import StoreError

SCHEMA_VERSION: Final = 3

BOOTSTRAP: Final = """CREATE TABLE IF NOT EXISTS {p}lw_meta (
    key TEXT PRIMARY KEY,
    value BIGINT NOT NULL
)"""
"""The one table that exists before any version: it records the version."""

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
    """CREATE TABLE {p}lw_holders (
        request_id TEXT NOT NULL,
        name TEXT NOT NULL,
        mode TEXT NOT NULL CHECK (mode IN ('S', 'X')),
        session_id TEXT NOT NULL,
        token BIGINT NOT NULL,
        granted_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (name, request_id)
    )""",
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

READ_VERSION: Final = "SELECT value FROM {p}lw_meta WHERE key = 'schema_version'"
WRITE_VERSION: Final = (
    "INSERT INTO {p}lw_meta (key, value) VALUES ('schema_version', :version)"
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
}


def steps(version: int, backend_steps: Mapping[int, Sequence[str]]) -> list[str]:
    """The statements that bring a database from ``version - 1`` to ``version``.

    The shared tables first, then what the backend adds for that version.
    """
    return [*_STEPS[version], *backend_steps.get(version, ())]


def pending(found: int | None, url: str) -> range:
    """The versions to apply to a database at version ``found`` (None: empty)."""
    current = found or 0
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"lock store {url} has schema version {current}, newer than this lockwarden "
            f"understands ({SCHEMA_VERSION}): upgrade lockwarden on this host"
        )
    return range(current + 1, SCHEMA_VERSION + 1)
