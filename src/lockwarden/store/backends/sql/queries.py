"""SQL text shared by the SQL backends.

Every statement here runs on SQLite, PostgreSQL and MySQL (as a plain
statement, embedded in PostgreSQL's PL/pgSQL functions (`plpgsql`), or
rewritten where MySQL's grammar differs (`mysql.backend._rewrite`)). A statement
is written once, with holes that `Dialect.render` fills:

- ``{p}``: the table prefix (``schema.`` on PostgreSQL, nothing on SQLite);
- ``{now}``: the database clock in seconds since the epoch (design note:
  no client clock value is ever written or compared);
- ``{started}``: when the database server started (microseconds), so that a
  restart can be noticed; a constant on SQLite, which has no server;
- ``{not_restarted}``: the condition that the server did not restart since the
  last grant (its start recorded in ``lw_meta`` is ``{started}``); TRUE where
  every lock transaction commits durably (SQLite, MySQL), as nothing is
  recorded there to compare;
- ``{in_names}``, ``{items}``: membership in the request's names, and its
  (name, mode) pairs as a subquery, over the bound lists ``:names`` and
  ``:modes`` (arrays on PostgreSQL; on SQLite the names as JSON text and the
  modes as one letter per name), so that one statement serves a whole multi-lock;
- ``{token}``: the next fencing token (a sequence on PostgreSQL; on SQLite a
  counter in ``lw_meta`` plus ``row_number()``, moved on by a trigger);
- ``:name``: a bound parameter (``%(name)s`` for psycopg, the variable
  ``_name`` inside PL/pgSQL). Every name and value travels this way.

Sessions are always aliased ``s`` so that `LIVE`, the liveness predicate of
the design note, is one piece of text used by every statement that judges a
session.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Final, NamedTuple

LIVE: Final = "(NOT s.expired AND s.heartbeat_at + s.ttl > {now})"
"""A session is live iff it is not marked expired and its heartbeat is younger than its TTL."""

_PARAM = re.compile(r"(?<![:\w]):([a-z_]+)")


class Dialect(NamedTuple):
    """How shared SQL text becomes runnable text for one target."""

    prefix: str
    now: str
    started: str
    in_names: str
    items: str
    token: str
    param: str
    """A format string for a bound parameter, given its name."""
    rewrite: Callable[[str], str] | None = None
    """Applied last, where a database spells the shared text differently (MySQL)."""
    restarts: bool = False
    """A restart of the server may lose commits that did not wait for the disk, so a grant
    checks for one (PostgreSQL's relaxed durability; design note, "Durability")."""

    @cache  # noqa: B019  (a handful of dialects live for the whole process)
    def render(self, sql: str) -> str:
        text = sql.format(
            p=self.prefix,
            now=self.now,
            started=self.started,
            not_restarted=(
                f"(SELECT value FROM {self.prefix}lw_meta WHERE key = 'started') = {self.started}"
                if self.restarts
                else "TRUE"
            ),
            in_names=self.in_names,
            items=self.items,
            token=self.token.format(p=self.prefix),
        )
        if self.param.startswith("%("):
            text = text.replace("%", "%%")  # psycopg: a literal % must be doubled
        text = _PARAM.sub(lambda m: self.param.format(m.group(1)), text)
        return text if self.rewrite is None else self.rewrite(text)


SQLITE: Final = Dialect(
    prefix="",
    now="((julianday('now') - 2440587.5) * 86400.0)",
    started="0",
    in_names="IN (SELECT value FROM json_each(:names))",
    # :modes is one letter per name ("SXX", `backends/sqlite/backend.py` binds it), read by
    # position: a join of two json_each tables has no index, and took time quadratic in the names.
    items="SELECT value AS name, substr(:modes, key + 1, 1) AS mode FROM json_each(:names)",
    # The counter in lw_meta, which a trigger on lw_holders moves up to each token
    # inserted (`backends/sqlite/backend.py`): a grant is one statement.
    token="(SELECT value FROM lw_meta WHERE key = 'token') + row_number() OVER ()",
    param=":{}",
)


def postgres(schema: str) -> Dialect:
    """Plain statements sent by psycopg."""
    return Dialect(
        prefix=f"{schema}.",
        now="date_part('epoch', clock_timestamp())",
        started="CAST(date_part('epoch', pg_postmaster_start_time()) * 1000000 AS BIGINT)",
        # Not IN (SELECT unnest(...)): as a generic plan that costs 30 times more.
        in_names="= ANY(CAST(:names AS text[]))",
        items=(
            "SELECT * FROM unnest(CAST(:names AS text[]), CAST(:modes AS text[])) AS i(name, mode)"
        ),
        token="nextval('{p}lw_token_seq')",
        param="%({})s",
        restarts=True,
    )


def plpgsql(schema: str) -> Dialect:
    """Statements inside PL/pgSQL: parameters are variables, the clock is read once."""
    return postgres(schema)._replace(now="_now", param="_{}")


# -- sessions ---------------------------------------------------------------

OPEN_SESSION: Final = """
INSERT INTO {p}lw_sessions
    (id, app_id, host, pid, pid_start, ttl, started_at, heartbeat_at, expired)
VALUES (:session, :app_id, :host, :pid, :pid_start, :ttl, {now}, {now}, FALSE)
RETURNING {started} AS started
"""

HEARTBEAT: Final = f"""
UPDATE {{p}}lw_sessions AS s SET heartbeat_at = {{now}}
WHERE s.id = :session AND {LIVE}
RETURNING {{started}} AS started
"""
"""The one statement a session sends per interval, however many locks it holds."""

EXPIRE_STALE: Final = f"""
UPDATE {{p}}lw_sessions AS s SET expired = TRUE WHERE NOT s.expired AND NOT {LIVE}
"""
"""Mark every stale session expired: the compare-and-swap that must precede removing its rows.

A heartbeat in flight either committed first (the session is live again and
is left alone) or finds the session expired (its locks are lost).
"""

# -- acquire (the algorithm of the design note; `sqlite` and `plpgsql` run it) --

ACQUIRE_STATE: Final = f"""
SELECT (SELECT {LIVE} FROM {{p}}lw_sessions AS s WHERE s.id = :session) AS live,
       (SELECT min(seq) FROM {{p}}lw_waiters WHERE request_id = :request) AS seq,
       EXISTS (SELECT 1 FROM {{p}}lw_holders WHERE name {{in_names}}
               AND request_id = :request AND session_id = :session) AS granted,
       NOT EXISTS (SELECT 1 FROM {{p}}lw_holders WHERE name {{in_names}})
       AND NOT EXISTS (SELECT 1 FROM {{p}}lw_waiters WHERE name {{in_names}}) AS idle,
       (SELECT value FROM {{p}}lw_meta WHERE key = 'started') AS started,
       {{started}} AS started_now
"""
"""Our session's liveness, our queue position if an earlier attempt enqueued,
whether an earlier attempt of this very request was already granted,
whether nobody holds or waits for any of the names (then nothing can be in
the way: the common, uncontended case skips `IN_THE_WAY`), and whether the
server restarted since the last grant (design note, "Durability")."""

IDLE: Final = f"""EXISTS (SELECT 1 FROM {{p}}lw_sessions AS s WHERE s.id = :session AND {LIVE})
  AND NOT EXISTS (SELECT 1 FROM {{p}}lw_holders WHERE name = :name)
  AND NOT EXISTS (SELECT 1 FROM {{p}}lw_waiters WHERE name = :name)
  AND {{not_restarted}}"""
"""Whether a single-name request may be granted at once, without the full algorithm: our
session is live, nobody holds or waits for :name and the server did not restart since
the last grant."""

TAKE_IDLE: Final = f"""
INSERT INTO {{p}}lw_holders (request_id, name, mode, session_id, token, granted_at)
SELECT :request, :name, :mode, :session, {{token}}, {{now}}
WHERE {IDLE}
RETURNING token
"""
"""The fast path of a single-name acquire: grant it if nobody holds or waits for the name,
our session is live and the server did not restart since the last grant; no row otherwise,
and the full algorithm decides (the state read, `IN_THE_WAY`, reclaim, queueing). A retry of
a granted request finds its own row on the name and goes the full way too (step 3)."""

BLOCKED_BY_LIVE: Final = f"""
EXISTS (SELECT 1 FROM {{p}}lw_holders AS h JOIN {{p}}lw_sessions AS s ON s.id = h.session_id
        WHERE h.name = :name AND {LIVE})
  AND NOT EXISTS (SELECT 1 FROM {{p}}lw_holders AS h JOIN {{p}}lw_sessions AS s
                  ON s.id = h.session_id WHERE h.name = :name AND NOT {LIVE})
  AND :mode = 'X'
  AND coalesce((SELECT write_permits FROM {{p}}lw_permits WHERE name = :name), 1) = 1
  AND EXISTS (SELECT 1 FROM {{p}}lw_sessions AS s WHERE s.id = :session AND {LIVE})
  AND NOT EXISTS (SELECT 1 FROM {{p}}lw_waiters WHERE request_id = :request)
  AND NOT EXISTS (SELECT 1 FROM {{p}}lw_holders WHERE session_id = :session)"""
"""Whether a single-name write request is certainly blocked, with nothing for the full
algorithm to do but queue it: a live session holds the name, and no dead one (nothing to
reclaim or refuse over); one writer at a time may hold it; our session is live; and the
request is not queued yet (nor granted: our session holds nothing, so it has no grant to
find and no deadlock to check). Such a request may queue at once and read what is in its
way later, outside the name's lock (design note, "Acquire"). Never true with `IDLE` (that
needs nobody holding the name), and false at its first condition for a free name."""

GRANTED: Final = """
SELECT name, token FROM {p}lw_holders
WHERE name {in_names} AND request_id = :request AND session_id = :session
"""

IN_THE_WAY: Final = f"""
WITH other AS (
    SELECT 'holder' AS kind, h.mode, h.granted_at AS since, NULL AS expires_at,
           s.id AS session_id, s.app_id, s.host, s.pid, s.pid_start, s.heartbeat_at, s.ttl,
           s.expired, {LIVE} AS live
    FROM {{p}}lw_holders AS h JOIN {{p}}lw_sessions AS s ON s.id = h.session_id
    WHERE h.name = :name
    UNION ALL
    SELECT 'waiter', w.mode, w.enqueued_at, w.expires_at,
           s.id, s.app_id, s.host, s.pid, s.pid_start, s.heartbeat_at, s.ttl, s.expired,
           {LIVE} AND (w.expires_at IS NULL OR w.expires_at > {{now}})
    FROM {{p}}lw_waiters AS w JOIN {{p}}lw_sessions AS s ON s.id = w.session_id
    WHERE w.name = :name AND w.request_id <> :request AND (:seq IS NULL OR w.seq < :seq)
),
counted AS (
    SELECT mode FROM other WHERE live OR (kind = 'holder' AND :refuse)
)
SELECT :name AS name, kind, mode, since, expires_at, session_id, app_id, host, pid, pid_start,
       heartbeat_at, ttl, expired, live, {{now}} AS now
FROM other
WHERE (kind = 'holder' AND NOT live AND NOT :refuse)
   OR ((live OR (kind = 'holder' AND :refuse))
       AND (mode <> :mode
            OR (SELECT count(*) FROM counted WHERE counted.mode = :mode)
               >= CASE :mode
                  WHEN 'X' THEN coalesce(
                      (SELECT write_permits FROM {{p}}lw_permits WHERE name = :name), 1)
                  ELSE (SELECT read_permits FROM {{p}}lw_permits WHERE name = :name)
                  END))
"""
"""Everything in the way of a request for (:name, :mode), one row each.

A holder or a waiter ahead of us (lower seq; all of them if we are not
queued yet: no barging) is in the way if it counts and either holds the
other mode, or our mode is at its permit cap counting it. Live rows count;
with the "refuse" policy dead holders count too (they are never overridden).
With "reclaim", dead holders are returned as well, flagged not live: the
caller must reclaim them (`RECLAIM_EXPIRE`, `RECLAIM_DELETE`) and ask again.
One name at a time, on purpose: with the name a constant, the plan is an
index lookup whatever the planner believes about the tables.
"""

RECLAIM_EXPIRE: Final = f"""
UPDATE {{p}}lw_sessions AS s SET expired = TRUE
WHERE s.id IN (SELECT session_id FROM {{p}}lw_holders WHERE name {{in_names}})
  AND NOT s.expired AND NOT {LIVE}
"""

RECLAIM_DELETE: Final = """
DELETE FROM {p}lw_holders AS h
WHERE h.name {in_names}
  AND NOT EXISTS (SELECT 1 FROM {p}lw_sessions AS s WHERE s.id = h.session_id AND NOT s.expired)
RETURNING name
"""
"""Remove the rows of expired (or vanished) sessions on the request's names. Only rows whose
session is already *marked* expired go: judging staleness alone would race a
heartbeat in flight (see `EXPIRE_STALE`)."""

COUNT_RECLAIMED: Final = "UPDATE {p}lw_meta SET value = value + :removed WHERE key = 'reclaimed'"
"""Count the holder rows `RECLAIM_DELETE` removed (:removed), in its transaction: a reclaim
that commits is counted once, one rolled back not at all, and one run again finds
nothing left to remove. Only this path counts: `CLEAN`, `BREAK_LOCK` and
`RELEASE_EXPIRED_OF_APP` also remove dead sessions' rows, but nobody takes the locks
over there (the last two are counted as overrides, `ADMIN_COUNTS`)."""

RECLAIMED: Final = "SELECT value FROM {p}lw_meta WHERE key = 'reclaimed'"
"""The count `COUNT_RECLAIMED` keeps: it only grows (a Prometheus counter)."""

INSERT_HOLDERS: Final = """
INSERT INTO {p}lw_holders (request_id, name, mode, session_id, token, granted_at)
SELECT :request, name, mode, :session, {token}, {now} FROM ({items}) AS i
RETURNING name, token
"""

INSERT_WAITERS: Final = """
INSERT INTO {p}lw_waiters (request_id, name, mode, session_id, seq, enqueued_at, expires_at)
SELECT :request, name, mode, :session, :seq, {now}, {now} + :wait FROM ({items}) AS i
"""

DEQUEUE: Final = """
DELETE FROM {p}lw_waiters WHERE request_id = :request AND session_id = :session
"""

DEQUEUED: Final = DEQUEUE.rstrip() + " RETURNING name\n"
"""`DEQUEUE` as a grant made by a release runs it, saying whether the queue entry was
still there (design note, "Release": a grant and a close)."""

UNGRANT: Final = """
DELETE FROM {p}lw_holders WHERE request_id = :request AND session_id = :session
"""
"""Take back the grant just made to a request whose queue entry was gone (`DEQUEUED`)."""

HOLDS_ANY: Final = """
SELECT EXISTS (SELECT 1 FROM {p}lw_holders WHERE session_id = :session) AS holds
"""

_WAITS_FOR: Final = f"""
waiting AS (
    SELECT w.name, w.mode, w.session_id, w.seq
    FROM {{p}}lw_waiters AS w JOIN {{p}}lw_sessions AS s ON s.id = w.session_id
    WHERE {LIVE} AND (w.expires_at IS NULL OR w.expires_at > {{now}})
),
node AS (
    SELECT name, mode, session_id, seq FROM waiting
    UNION ALL
    SELECT h.name, h.mode, h.session_id, -1
    FROM {{p}}lw_holders AS h JOIN {{p}}lw_sessions AS s ON s.id = h.session_id
    WHERE {LIVE} AND h.name IN (SELECT name FROM waiting)
),
edge AS (
    SELECT DISTINCT w.session_id AS src, x.session_id AS dst, w.name
    FROM waiting AS w
    JOIN node AS x ON x.name = w.name AND x.seq < w.seq AND x.session_id <> w.session_id
    LEFT JOIN {{p}}lw_permits AS pm ON pm.name = w.name
    WHERE x.mode <> w.mode
       OR CASE w.mode WHEN 'X' THEN coalesce(pm.write_permits, 1) ELSE pm.read_permits END = 1
)
"""
"""The waits-for edges between live sessions: W waits for X on a name where X holds, or
waits ahead, in a mode that excludes W's (a different mode, or the same mode capped at one
permit). One text for the deadlock check and for `Store.waits_for`."""

DEADLOCK_EDGES: Final = f"""
WITH RECURSIVE
{_WAITS_FOR},
reach(sid) AS (
    SELECT dst FROM edge WHERE src = :session
    UNION
    SELECT edge.dst FROM edge JOIN reach ON edge.src = reach.sid
)
SELECT DISTINCT src, dst FROM edge
WHERE EXISTS (SELECT 1 FROM reach WHERE sid = :session)
  AND (src = :session OR src IN (SELECT sid FROM reach))
"""
"""The edges reachable from :session if :session is on a cycle of waits, and nothing otherwise.

(A same-mode holder under a cap above one is not an edge: any one of them
leaving would do, so a cycle through it need not be a deadlock.)
"""

# -- release ----------------------------------------------------------------

RELEASE: Final = """
DELETE FROM {p}lw_holders
WHERE name {in_names} AND request_id = :request AND session_id = :session
RETURNING name
"""
"""Release a stamp. Holder rows never change once granted (a reclaim or break
deletes them and a new grant inserts a new row under a new request id), so
deleting by our request id deletes only rows still carrying our tokens."""

QUEUED_FOR_HOLDER: Final = (
    "EXISTS (SELECT 1 FROM {p}lw_waiters AS w WHERE w.name = {p}lw_holders.name)"
)
"""Whether anyone waits for the name of a holder row being released."""

RELEASE_IDLE: Final = f"""
DELETE FROM {{p}}lw_holders
WHERE name = :name AND request_id = :request AND session_id = :session
  AND NOT {QUEUED_FOR_HOLDER}
RETURNING name
"""
"""`RELEASE` of one name (compared, not looked up in a list) nobody waits for, as one
statement: no row if anyone waits (or the lock was lost), and the full release decides.
SQLite and MySQL try it first for a name they have not seen fought over (`FoughtOver`)."""

# -- grant on release (design note, "Release") --------------------------------

GRANT_CANDIDATES: Final = f"""
SELECT w.request_id, w.session_id, min(w.seq) AS seq
FROM {{p}}lw_waiters AS w JOIN {{p}}lw_sessions AS s ON s.id = w.session_id
WHERE w.name {{in_names}} AND {LIVE} AND (w.expires_at IS NULL OR w.expires_at > {{now}})
GROUP BY w.request_id, w.session_id
ORDER BY min(w.seq)
"""
"""The requests queued on the released names that may still be granted (live session,
not past their deadline), in queue order. (A request's rows share one seq.)"""

HEAD_ALONE: Final = f"""
WITH head AS (
    SELECT w.request_id, w.session_id, w.mode
    FROM {{p}}lw_waiters AS w JOIN {{p}}lw_sessions AS s ON s.id = w.session_id
    WHERE w.name = :name AND {LIVE} AND (w.expires_at IS NULL OR w.expires_at > {{now}})
    ORDER BY w.seq
    LIMIT 1
),
alone AS (
    SELECT h.request_id, h.session_id FROM head AS h
    WHERE h.mode = 'X'
      AND NOT EXISTS (SELECT 1 FROM {{p}}lw_holders WHERE name = :name)
      AND NOT EXISTS (SELECT 1 FROM {{p}}lw_waiters AS o
                      WHERE o.request_id = h.request_id AND o.session_id = h.session_id
                        AND o.name <> :name)
      AND coalesce((SELECT write_permits FROM {{p}}lw_permits WHERE name = :name), 1) = 1
      AND {{not_restarted}}
)"""
"""The common hand-off (design note, "Release"): after a release of one name, ``alone``
is its first live waiter if that is a single-name exclusive request, with nobody left
holding the name (dead holders included), a write cap of one and no server restart since
the last grant; empty otherwise. The grant loop would grant that waiter (nothing is in
its way: no holder, no live waiter ahead, nothing counted against the cap), and then
nothing more on the name, where every later candidate is blocked by the new writer."""

GRANT_HEAD: Final = f"""
INSERT INTO {{p}}lw_holders (request_id, name, mode, session_id, token, granted_at)
{HEAD_ALONE}
SELECT request_id, :name, 'X', session_id, {{token}}, {{now}} FROM alone
RETURNING request_id, session_id, token
"""
"""`HEAD_ALONE`'s waiter granted, in one statement (its queue entry is left to `DEQUEUE`);
no row if the loop must decide. PostgreSQL makes the same grant and dequeue as one
statement inside its function (`plpgsql`)."""

WAITING_ITEMS: Final = """
SELECT name, mode FROM {p}lw_waiters WHERE request_id = :request AND session_id = :session
"""
"""Every (name, mode) a queued request waits for: a multi-lock is granted all or nothing."""

HOLDING_WAITERS: Final = """
SELECT DISTINCT w.request_id, w.session_id FROM {p}lw_waiters AS w
WHERE w.name {in_names}
  AND EXISTS (SELECT 1 FROM {p}lw_holders AS h WHERE h.session_id = w.session_id)
"""
"""Waiters left on the released names whose sessions hold locks: asked to attempt again,
because their attempt runs the deadlock check, which a grant may complete (design note,
"Release"). Not after the common hand-off to a session that waits for nothing else
(`WAITS_ANY`): that grant completes no cycle."""

WAITS_ANY: Final = """
SELECT EXISTS (SELECT 1 FROM {p}lw_waiters WHERE session_id = :session) AS waits
"""
"""Whether a session has any queue entry: asked of the session a hand-off just granted,
its granted request dequeued. A grant can complete a cycle only through such a session."""

# -- reads ------------------------------------------------------------------

CHECK: Final = f"""
SELECT (SELECT {LIVE} FROM {{p}}lw_sessions AS s WHERE s.id = :session) AS live,
       (SELECT count(*) FROM {{p}}lw_holders
        WHERE name {{in_names}} AND request_id = :request AND session_id = :session) AS held
"""
"""Whether our session is live, and how many rows of a stamp are still ours (`check()`)."""

LOCKS: Final = f"""
SELECT h.name, h.mode, h.token, s.id AS session_id, s.app_id, s.host, s.pid,
       h.granted_at AS since, s.heartbeat_at, {{now}} AS now, NOT {LIVE} AS stale
FROM {{p}}lw_holders AS h JOIN {{p}}lw_sessions AS s ON s.id = h.session_id
WHERE h.name = coalesce(:name, h.name)
ORDER BY h.name, h.token
"""

WAITERS: Final = f"""
SELECT w.name, w.mode, s.id AS session_id, s.app_id, s.host, s.pid,
       {{now}} - w.enqueued_at AS waited_for, w.expires_at - {{now}} AS expires_in,
       NOT ({LIVE} AND (w.expires_at IS NULL OR w.expires_at > {{now}})) AS stale
FROM {{p}}lw_waiters AS w JOIN {{p}}lw_sessions AS s ON s.id = w.session_id
WHERE w.name = coalesce(:name, w.name)
ORDER BY w.name, w.seq
"""

SESSIONS: Final = f"""
SELECT s.id AS session_id, s.app_id, s.host, s.pid, s.ttl,
       {{now}} - s.started_at AS age, {{now}} - s.heartbeat_at AS heartbeat_age, {LIVE} AS live
FROM {{p}}lw_sessions AS s
ORDER BY s.started_at, s.id
"""

WAITS_FOR: Final = f"""
WITH {_WAITS_FOR}
SELECT src, dst, name FROM edge ORDER BY src, dst, name
"""

PERMITS: Final = """
SELECT read_permits, write_permits FROM {p}lw_permits WHERE name = :name
"""

FENCE_READ: Final = """
SELECT token, written, value FROM {p}lw_fences WHERE resource = :resource
"""

FENCE_ADVANCE: Final = f"""
INSERT INTO {{p}}lw_fences AS f (resource, token, written, value, updated_at)
SELECT :resource, CAST(:token AS BIGINT), CASE WHEN :write THEN CAST(:token AS BIGINT) ELSE 0 END,
       CAST(:value AS TEXT), {{now}}
WHERE (CAST(:request AS TEXT) IS NULL OR EXISTS (
    SELECT 1 FROM {{p}}lw_holders AS h JOIN {{p}}lw_sessions AS s ON s.id = h.session_id
    WHERE h.request_id = CAST(:request AS TEXT) AND h.session_id = CAST(:session AS TEXT)
      AND h.token = CAST(:token AS BIGINT) AND {LIVE}))
ON CONFLICT (resource) DO UPDATE
SET token = CASE WHEN f.token < excluded.token THEN excluded.token ELSE f.token END,
    written = CASE WHEN :write THEN excluded.token ELSE f.written END,
    value = CASE WHEN :write THEN excluded.value ELSE f.value END,
    updated_at = excluded.updated_at
WHERE CASE WHEN :write THEN f.token ELSE f.written END <= excluded.token
RETURNING token, value
"""
"""Admit a token at a fence, and with :write store a value, in one atomic step.

A write needs a token at least as new as every token admitted; a read (an
admit) one at least as new as the last write's. With a :request (an access
that carries its lock, not only a token), the lock must also still be held —
its holder row there, with this token, its session live — in the same
statement. No row comes back otherwise.
"""

FENCE_HELD: Final = f"""
SELECT count(*) AS n FROM {{p}}lw_holders AS h JOIN {{p}}lw_sessions AS s ON s.id = h.session_id
WHERE h.request_id = :request AND h.session_id = :session AND h.token = :token AND {LIVE}
"""
"""`FENCE_ADVANCE`'s lock check, for a backend that runs it apart (MySQL, in the same
transaction, under the fence's row lock)."""

FENCE_RESET: Final = """
DELETE FROM {p}lw_fences WHERE resource = :resource RETURNING token
"""

# -- changes that may let waiters in --------------------------------------------
#
# Each is a list of statements returning a ``name`` column: the lock names
# whose waiters must be woken (NULL where a statement touches no name). Every
# SQL backend runs a list in order, in one transaction, each statement seeing
# what the ones before it did and what committed before it began; PostgreSQL
# notifies the names, the others wake their waiters.
#
# Waiter rows go before holder rows: a grant in flight to one of the waiters
# has deleted (so locked) the waiter's rows, and the deletion here waits for it
# to end; the holder rows are then read after its commit, the new grant among
# them (design note, "Release": a grant and a close).

CLOSE_SESSION: Final = (
    "DELETE FROM {p}lw_waiters WHERE session_id = :session RETURNING name",
    "DELETE FROM {p}lw_holders WHERE session_id = :session RETURNING name",
    "DELETE FROM {p}lw_sessions WHERE id = :session RETURNING CAST(NULL AS TEXT) AS name",
)

EXPIRE_SESSION: Final = (
    "UPDATE {p}lw_sessions SET expired = TRUE WHERE id = :session"
    " RETURNING CAST(NULL AS TEXT) AS name",
    "SELECT name FROM {p}lw_holders WHERE session_id = :session",
)

EXPIRE_APP: Final = (
    f"UPDATE {{p}}lw_sessions AS s SET expired = TRUE WHERE s.app_id = :app_id"
    f" AND NOT s.expired AND (:force OR NOT {LIVE}) RETURNING CAST(NULL AS TEXT) AS name",
)
"""`release_all`'s first step: mark an application's sessions expired — only those no
longer live (the compare-and-swap of `EXPIRE_STALE`), or with :force every one."""

RELEASE_EXPIRED_OF_APP: Final = (
    "DELETE FROM {p}lw_waiters WHERE session_id IN"
    " (SELECT id FROM {p}lw_sessions WHERE app_id = :app_id AND expired) RETURNING name",
    "DELETE FROM {p}lw_holders WHERE session_id IN"
    " (SELECT id FROM {p}lw_sessions WHERE app_id = :app_id AND expired) RETURNING name",
)
"""`release_all`'s second step, once the first step's marks are committed: every lock and
wait of the application's expired sessions goes (a grant that judged one of them live
before the mark may still be in flight: waiters first)."""

RECORD_ADMIN: Final = """
INSERT INTO {p}lw_admin (id, at, action, subject, detail, host, pid)
VALUES (:id, {now}, :action, :subject, :detail, :host, :pid)
"""

ADMIN_LOG: Final = """
SELECT at, action, subject, detail, host, pid, {now} AS now FROM {p}lw_admin
ORDER BY at DESC LIMIT :limit
"""

ADMIN_COUNTS: Final = "SELECT action, COUNT(*) AS n FROM {p}lw_admin GROUP BY action"
"""How many overrides of each kind the store has recorded: nothing deletes a record,
so each count only grows (a Prometheus counter)."""

BREAK_LOCK: Final = ("DELETE FROM {p}lw_holders WHERE name = :name RETURNING name",)

CLEAN: Final = (
    "DELETE FROM {p}lw_waiters AS w WHERE w.expires_at <= {now}"
    " OR NOT EXISTS (SELECT 1 FROM {p}lw_sessions AS s"
    " WHERE s.id = w.session_id AND NOT s.expired) RETURNING name",
    "DELETE FROM {p}lw_holders AS h WHERE NOT EXISTS (SELECT 1 FROM {p}lw_sessions AS s"
    " WHERE s.id = h.session_id AND NOT s.expired) RETURNING name",
    "DELETE FROM {p}lw_sessions WHERE expired RETURNING CAST(NULL AS TEXT) AS name",
)
"""Remove what is dead, after `EXPIRE_STALE` has marked it: expired sessions with
their locks and waits, and waits past their deadline."""

SET_PERMITS: Final = (
    "INSERT INTO {p}lw_permits (name, read_permits, write_permits)"
    " VALUES (:name, :read, :write) ON CONFLICT (name) DO UPDATE"
    " SET read_permits = excluded.read_permits, write_permits = excluded.write_permits"
    " RETURNING name",
)

RESET_PERMITS: Final = ("DELETE FROM {p}lw_permits WHERE name = :name RETURNING name",)
