"""The MySQL / MariaDB backend: bucket rows locked per name, doorbells rung by ``KILL QUERY``.

The acquire algorithm runs client-side (`attempt`), statement by statement,
in one InnoDB transaction at READ COMMITTED, like SQLite's; the statements
are the shared ones of `queries`, rewritten where MySQL spells them
differently (`_rewrite`). What is MySQL's own (design note, "MySQL and
MariaDB"):

- names are serialized by ``SELECT ... FOR UPDATE`` on rows of
  ``lw_buckets``, one per bucket of names, taken in bucket order: row locks
  end with the transaction, also when the client is killed, and InnoDB's
  deadlock detector never sees a cycle between acquirers;
- counters are rows of ``lw_meta`` advanced with ``LAST_INSERT_ID(expr)``;
- wake-ups: a release that grants to a waiter of its own machine pokes the
  waiter's store (`inbox`), which then holds the lock; every other wake-up
  rings a doorbell: every process that waits keeps one connection blocked in
  ``SLEEP`` on its doorbell row, and a releaser rings the doorbells of the
  processes concerned and interrupts their ``SLEEP`` with ``KILL QUERY``.
  No one polls.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import queue
import re
import select
import socket
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import cache
from typing import Any, Final, TypeVar

from lockwarden.errors import StoreError
from lockwarden.store import bounds, inbox
from lockwarden.store.backends.base import (
    AcquireRequest,
    Attempt,
    FoughtOver,
    Opening,
    Params,
    Pool,
    Row,
    Run,
)
from lockwarden.store.backends.mysql.url import mysql_options
from lockwarden.store.backends.sql import queries
from lockwarden.store.backends.sql.algorithm import Engine, attempt, grant
from lockwarden.store.backends.sql.base import BUCKETS, GRAPH_KEY, SQLBackend
from lockwarden.store.backends.sql.calm import CalmRelease
from lockwarden.store.retry import RETRY_DELAYS, verdict
from lockwarden.store.url import StoreURL
from lockwarden.store.wakeups import Told

Connection = Any  # the driver is untyped

T = TypeVar("T")

_NAP: Final = 600
"""Seconds a doorbell ``SLEEP`` lasts when nobody rings (then it simply sleeps again)."""

_KILLED: Final = 1317
"""ER_QUERY_INTERRUPTED: a ``KILL QUERY`` arrived before the ``SLEEP`` began."""

_TRANSIENT: Final = frozenset(
    {
        1205,  # lock wait timeout
        1213,  # deadlock: InnoDB rolled the transaction back
        1053,  # server shutdown in progress
        1927,  # connection was killed
        2002,  # cannot connect through the socket
        2003,  # cannot connect to the server
        2006,  # server has gone away
        2013,  # lost connection during a query
        4031,  # disconnected by the server (idle)
    }
)
"""Errors after which a fresh connection may succeed (the transaction was rolled back)."""

IDLE_IN_TRANSACTION: Final = 1
"""Seconds the server lets a lock connection sit idle inside a transaction before it ends
the connection, rolling the transaction back (MariaDB's ``idle_transaction_timeout``).

The algorithm runs here statement by statement, so a process paused between two of them
(SIGSTOP, a debugger, a frozen VM) would keep its transaction's row locks for as long as
it stays paused: its names' buckets, and the tokens' counter row that every grant in the
database needs. The library never waits between the statements of a transaction, so an
idle second means the process is not running; it finds its connection gone when it runs
again, and the call is sent again whole on a fresh one, as after any dropped connection
(design note, "Faults")."""

_COLLATION: Final = "utf8mb4_nopad_bin"
"""Names compare byte for byte: ``_bin`` so case matters, ``nopad`` so trailing spaces do."""


_NAME_COLUMN: Final = f"VARCHAR(512) CHARACTER SET utf8mb4 COLLATE {_COLLATION}"


_TABLE_OPTIONS: Final = f" ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={_COLLATION}"

_RULES: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(pattern, re.DOTALL), replacement)
    for pattern, replacement in (
        # No TEXT type in a CAST.
        (r"CAST\(NULL AS TEXT\)", "CAST(NULL AS CHAR)"),
        # Upserts: MySQL names neither the conflicting key nor the new row.
        (r"ON CONFLICT \(\w+\) DO UPDATE SET", "ON DUPLICATE KEY UPDATE"),
        (r"\bexcluded\.(\w+)", r"VALUES(\1)"),
        # KEY is a reserved word (the column of lw_meta is written in lower case).
        (r"(?<!%\()\bkey\b", "`key`"),
        # DDL: a key cannot be TEXT; a fence's value can be long. Every step can
        # be run again: DDL commits at once, so a migration cut short is finished
        # by the next one rather than rolled back.
        (r"\bvalue TEXT\b", "value LONGTEXT"),
        # Session ids are 48 hex digits, request ids 32; two of them and a name fit in a key.
        (r"\b(id|request_id|session_id) TEXT\b", r"\1 VARCHAR(64)"),
        (r"\bTEXT\b(?=[\s,)])", "VARCHAR(512)"),
        (r"^\s*CREATE TABLE (?:IF NOT EXISTS )?(.*)\)\s*$", r"CREATE TABLE IF NOT EXISTS \1)"),
        (r"^\s*CREATE INDEX (?:IF NOT EXISTS )?", "CREATE INDEX IF NOT EXISTS "),
        # MySQL names the table of the index dropped; ours are named after it.
        (r"^(\s*DROP INDEX IF EXISTS ((lw_[a-z]+)_\w+))\s*$", r"\1 ON \3"),
        (r"\bADD COLUMN (?!IF NOT EXISTS)", "ADD COLUMN IF NOT EXISTS "),
    )
)

_DELETE_ALIAS: Final = re.compile(r"DELETE FROM (\w+) AS (\w+)\s")
_UPDATE_RETURNING: Final = re.compile(r"^(\s*UPDATE\b.*?)\s+RETURNING\s+(.*)$", re.DOTALL)


@cache
def _rewrite(text: str) -> str:
    """Shared SQL as MariaDB reads it (each rule says why it is needed)."""
    # A single-table DELETE takes no alias: name the table instead.
    if found := _DELETE_ALIAS.search(text):
        table, alias = found.groups()
        text = _DELETE_ALIAS.sub(f"DELETE FROM {table} ", text)
        text = re.sub(rf"\b{alias}\.", f"{table}.", text)
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    if text.lstrip().startswith("CREATE TABLE"):
        text += _TABLE_OPTIONS
    return text


DIALECT: Final = queries.Dialect(
    prefix="",  # the connection's database holds the store
    # NOW(6) is the statement's start in UTC (the connection's time zone is
    # '+00:00'); + 0E0 makes it a DOUBLE, as the columns are, not a DECIMAL.
    now="(UNIX_TIMESTAMP(NOW(6)) + 0E0)",
    started="0",  # every lock transaction commits durably: no restart to notice
    in_names=(
        "IN (SELECT j.name FROM JSON_TABLE(:names, '$[*]'"
        f" COLUMNS (name {_NAME_COLUMN} PATH '$')) AS j)"
    ),
    items=(
        "SELECT n.name, m.mode"
        f" FROM JSON_TABLE(:names, '$[*]' COLUMNS (i FOR ORDINALITY, name {_NAME_COLUMN} PATH '$'))"
        " AS n JOIN JSON_TABLE(:modes, '$[*]' COLUMNS (i FOR ORDINALITY, mode CHAR(1) PATH '$'))"
        " AS m ON m.i = n.i"
    ),
    token=":first_token + row_number() OVER () - 1",
    param="%({})s",
    rewrite=_rewrite,
)


# -- MySQL's own statements ------------------------------------------------------


_RESERVE: Final = "UPDATE lw_meta SET value = LAST_INSERT_ID(value + :n) WHERE key = :key"
"""The new value comes back with the reply (as an insert id): one round trip."""

_GRANT_HEAD: Final = "; ".join(
    (
        DIALECT.render(_RESERVE.replace(":n", "1").replace(":key", "'token'")),
        DIALECT._replace(token="LAST_INSERT_ID()").render(queries.GRANT_HEAD),
    )
)
"""`queries.GRANT_HEAD` with the token reserved just before it, in one round trip
(`Engine.grant_head`)."""


def _taking(queue: bool) -> str:
    """`queries.TAKE_IDLE` as MySQL can send it in the round trip that opens the transaction
    and locks the name's bucket: decide (`queries.IDLE`), take a token and insert the grant
    only if the name is free, say so, and commit.

    With ``queue``, the same request also queues the common wait, as PostgreSQL's
    `lw_lock` does: a request that would wait and is certainly blocked by a live holder,
    with nothing else at stake (`queries.BLOCKED_BY_LIVE`), takes a seq and is queued;
    the answer says which (the value is the token, or the seq). Sent for every name, it
    made an uncontended pair about 0.1 ms dearer (MySQL design note), so it is sent for
    names fought over only (`FoughtOver`). Otherwise nothing was written, and the full
    algorithm decides in a transaction of its own.
    """
    decide = f"SET @lw_idle = ({queries.IDLE}), @lw_queue = "
    counter = "'token' AND @lw_idle"
    queueing: tuple[str, ...] = ()
    if queue:
        decide += f":enqueue AND ({queries.BLOCKED_BY_LIVE})"
        counter = "CASE WHEN @lw_idle THEN 'token' WHEN @lw_queue THEN 'seq' END"
        queueing = (
            "INSERT INTO lw_waiters"
            " (request_id, name, mode, session_id, seq, enqueued_at, expires_at)"
            " SELECT :request, :name, :mode, :session, LAST_INSERT_ID(), {now}, {now} + :wait"
            " FROM DUAL WHERE @lw_queue",
        )
    else:
        decide += "FALSE"
    statements = (
        decide,
        f"UPDATE lw_meta SET value = LAST_INSERT_ID(value + 1) WHERE key = {counter}",
        "INSERT INTO lw_holders (request_id, name, mode, session_id, token, granted_at)"
        " SELECT :request, :name, :mode, :session, LAST_INSERT_ID(), {now}"
        " FROM DUAL WHERE @lw_idle",
        *queueing,
        "SELECT @lw_idle AS idle, @lw_queue AS queued, LAST_INSERT_ID() AS value",
        "COMMIT",
    )
    return "; ".join(map(DIALECT.render, statements))


_TAKE_IDLE: Final = _taking(queue=False)
_TAKE_OR_QUEUE: Final = _taking(queue=True)


_STEPS: Final = {
    1: [
        "INSERT INTO lw_meta (key, value) VALUES ('token', 0), ('seq', 0)",
        # One row per bucket of names, and one (GRAPH_KEY) for deadlock checks.
        "CREATE TABLE lw_buckets (id INTEGER PRIMARY KEY)",
        "INSERT IGNORE INTO lw_buckets (id) VALUES "
        + ", ".join(f"({i})" for i in range(GRAPH_KEY, BUCKETS)),
        # One row per process that waits: its doorbell (`MySQLBackend._listen`).
        """CREATE TABLE lw_doorbells (
            id VARCHAR(32) PRIMARY KEY,
            host VARCHAR(512) NOT NULL,
            pid BIGINT NOT NULL,
            conn_id BIGINT NOT NULL,
            rings BIGINT NOT NULL
        )""",
        "CREATE INDEX lw_doorbells_process ON lw_doorbells (host, pid)",
    ]
}

_DOORBELL_HANG: Final = (
    "INSERT INTO lw_doorbells (id, host, pid, conn_id, rings)"
    " VALUES (:me, :host, :pid, CONNECTION_ID(), 0)"
    " ON DUPLICATE KEY UPDATE conn_id = CONNECTION_ID()"
)
_DOORBELL_LISTEN: Final = (
    "SELECT rings, SLEEP(IF(rings = :seen, :nap, 0)) AS slept FROM lw_doorbells WHERE id = :me"
)
"""Reads the ring count and sleeps only if nobody rang since ``:seen``, in one statement:
a ring committed before the read is seen, one committed after it finds the
statement running and interrupts it (rings are committed before the KILL)."""

_DOORBELL_REMOVE: Final = "DELETE FROM lw_doorbells WHERE id = :me"

# Whose doorbells a release rings: processes with a waiter on one of the names.
_WAITING_PROCESS: Final = (
    "EXISTS (SELECT 1 FROM lw_waiters AS w JOIN lw_sessions AS s ON s.id = w.session_id"
    " WHERE w.name {in_names} AND s.host = d.host AND s.pid = d.pid)"
)
_TOLD: Final = (
    "s.id IN (SELECT j.id FROM JSON_TABLE(:sessions, '$[*]' COLUMNS (id VARCHAR(64) PATH '$'))"
    " AS j)"
)
_NEAR: Final = "LEFT(s.pid_start, CHAR_LENGTH(:near)) = :near"
"""The session was opened on the machine (boot, pid namespace) that ``:near`` begins
the identities of (`process.identity`)."""
# Whose doorbells a grant rings: the processes of the sessions it tells, but not
# those of this machine (``:near``; NULL: all), which a poke reaches.
_SESSION_PROCESS: Final = (
    f"EXISTS (SELECT 1 FROM lw_sessions AS s WHERE {_TOLD}"
    " AND s.host = d.host AND s.pid = d.pid"
    f" AND (:near IS NULL OR s.pid_start IS NULL OR NOT {_NEAR}))"
)
_NEAR_SESSIONS: Final = f"SELECT s.id FROM lw_sessions AS s WHERE {_TOLD} AND {_NEAR}"
"""Which sessions a grant tells were opened on this machine: they are poked."""
_QUEUED: Final = "SELECT 1 AS queued FROM lw_waiters WHERE name {in_names} LIMIT 1"
"""A row if anyone waits for one of the names."""
_RELEASE: Final = "; ".join(map(DIALECT.render, (queries.RELEASE, queries.DEQUEUE, _QUEUED)))
"""After the bucket locks, a release's first request: the delete, the dequeue, and whether
anyone waits (`MySQLBackend.release`)."""
_RELEASE_IDLE: Final = DIALECT.render(queries.RELEASE_IDLE)
"""`MySQLBackend._release_idle`'s statement."""
_RING: Final = "UPDATE lw_doorbells AS d SET rings = rings + 1 WHERE d.id <> :me AND ({who})"
_RING_TOLD: Final = DIALECT.render(_RING.format(who=_SESSION_PROCESS))
"""A grant's ring: the doorbells of the told sessions' processes on other machines."""
_RING_TOLD_NEAR: Final = f"{_RING_TOLD}; {DIALECT.render(_NEAR_SESSIONS)}; COMMIT"
"""`_RING_TOLD`, which told sessions are of this machine (`_NEAR_SESSIONS`), the commit."""
_RING_TOLD_ALL: Final = f"{_RING_TOLD}; COMMIT"
"""`_RING_TOLD` where no session is near (no pokes here), and the commit."""
_LISTENING: Final = (
    "SELECT d.conn_id FROM lw_doorbells AS d"
    " JOIN information_schema.PROCESSLIST AS p ON p.ID = d.conn_id"
    " WHERE d.id <> :me AND ({who}) AND p.INFO LIKE '%lw_doorbells%'"
)
"""Connection ids are checked against the server's list right before the KILL:
an id left by a dead process may, after a server restart, belong to anyone."""

# Fences: MySQL's upsert can neither be conditional nor return rows, so the
# fence's compare-and-set is a row lock and two statements.
_FENCE_ENSURE: Final = (
    "INSERT IGNORE INTO lw_fences (resource, token, written, value, updated_at)"
    " VALUES (:resource, 0, 0, NULL, {now})"
)
_FENCE_LOCK: Final = (
    "SELECT token, written, value FROM lw_fences WHERE resource = :resource FOR UPDATE"
)
_FENCE_SET: Final = (
    "UPDATE lw_fences SET token = GREATEST(token, :token),"
    " written = CASE WHEN :write THEN :token ELSE written END,"
    " value = CASE WHEN :write THEN :value ELSE value END, updated_at = {now}"
    " WHERE resource = :resource"
)


def _import_driver() -> Any:
    try:
        driver = importlib.import_module("pymysql")  # an optional dependency
        importlib.import_module("pymysql.cursors")
        importlib.import_module("pymysql.constants.CLIENT")
        importlib.import_module("pymysql.constants.COMMAND")
    except ImportError as exc:
        raise StoreError(
            "MySQL stores need the PyMySQL driver: pip install 'lockwarden[mysql]'"
        ) from exc
    return driver


@cache
def _cursor_class(driver: Any) -> Any:
    """The driver's dict cursor, except that an exception not its own reads nothing more.

    The driver's cursor, as it closes, reads what is left of the results. But an
    exception raised by a signal's handler (Ctrl-C, the command line's stop
    signals) between the driver's calls leaves the connection midway through an
    answer, and that read fails with "Commands out of sync": the user would get a
    `StoreError` in place of their KeyboardInterrupt. Such a connection is never
    read again: the pool closes a connection whose work raised, and the server
    then rolls back its transaction and frees its named locks.
    """

    class Cursor(driver.cursors.DictCursor):  # type: ignore[misc]
        def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
            if kind is None or issubclass(kind, driver.Error):
                self.close()
            else:
                self.connection = None

    return Cursor


def bucket(name: str) -> int:
    """The bucket row that serializes requests for ``name``."""
    return zlib.crc32(name.encode()) & (BUCKETS - 1)


class MySQLBackend(CalmRelease, SQLBackend):
    dialect = DIALECT

    def __init__(self, url: StoreURL, *, opening: Opening = "create") -> None:
        super().__init__(url)
        self._driver = _import_driver()
        self._options = mysql_options(url.target)
        self._pool: Pool[Connection] = Pool(self._connect, _close)
        self._near = inbox.near()
        """The releases of this store poke the waiters whose sessions' identities begin so,
        and ring the others."""
        if self._near is not None:
            self.pokes, self.look_every = True, inbox.LOOK_EVERY
        self._outbox = inbox.Outbox()
        self._closed = threading.Event()
        self._contended = FoughtOver()
        """Names whose acquire queues the common wait in its first round trip (`_taking`)."""
        self._listen_conn: int | None = None
        self._knocks: queue.SimpleQueue[tuple[str, Params] | None] = queue.SimpleQueue()
        self._knocker: threading.Thread | None = None
        self._knocker_lock = threading.Lock()
        self._listener = self._listener_of(self._listen, "lockwarden-doorbell")
        self._migrate((), _STEPS, opening)

    def _connect(self) -> Connection:
        """A new connection, made within the time the call has left (`bounds`) and the
        URL's ``connect_timeout``, its handshake and set-up included.

        The driver's own ``connect_timeout`` bounds only the TCP connect: a server
        that accepts and then says nothing (a frozen process, a half-open
        partition) would hold the handshake forever. So the socket is made here
        and the whole handshake is watched by the cutter, like any statement.
        """
        CLIENT = self._driver.constants.CLIENT  # noqa: N806  (the driver's name)
        options = dict(self._options)
        given = options.pop("connect_timeout")
        assert isinstance(given, int)  # `mysql_options` checked it
        end = min(bounds.deadline(self.url.call_timeout), time.monotonic() + given)
        options.update(_tls(options))
        conn: Connection = self._driver.connect(
            **options,
            defer_connect=True,
            charset="utf8mb4",
            autocommit=True,
            cursorclass=_cursor_class(self._driver),
            # UPDATE reports the rows it matched, not only those it changed.
            # MULTI_STATEMENTS: a transaction opens and locks its buckets in one round trip.
            client_flag=CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS,
            init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        )
        try:
            sock = _dial(options, end - time.monotonic())
        except OSError as exc:
            # The driver's words for it (the URL is in the message `_run` makes).
            raise self._driver.OperationalError(
                2003, f"Can't connect to MySQL server ({exc})"
            ) from exc
        with bounds.CUTTER.watch(sock.fileno(), end):
            conn.connect(sock)  # closes the socket if it fails
            with conn.cursor() as cur:
                # The database clock in UTC; strict: refuse rather than truncate.
                cur.execute(
                    "SET time_zone = '+00:00', sql_mode = 'STRICT_ALL_TABLES',"
                    f" idle_transaction_timeout = {IDLE_IN_TRANSACTION}"
                )
        return conn

    def _has_store(self) -> bool:
        rows = self.query(
            "SELECT 1 AS found FROM information_schema.tables"
            " WHERE table_schema = DATABASE() AND table_name = 'lw_meta'"
        )
        return bool(rows)

    # -- running statements ----------------------------------------------------------

    def _run(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` on a pooled connection; retry it on a fresh one after a transient
        error; all within the call timeout (`bounds`: a statement that has not answered
        when the time is up has its socket shut down under it)."""
        start = time.monotonic()
        end = bounds.deadline(self.url.call_timeout)

        def bounded(conn: Connection) -> T:
            if end <= time.monotonic():
                raise _Overran
            with bounds.CUTTER.watch(_socket(conn).fileno(), end) as watched:
                try:
                    return work(conn)
                except self._driver.Error:
                    if watched.cut:
                        raise _Overran from None
                    raise

        with bounds.within(end - start):  # a new connection (`_connect`) is bounded too
            for delay in (*RETRY_DELAYS, None):
                try:
                    return self._pool.run(bounded)
                except _Overran:
                    raise bounds.overran(self.url.display, start) from None
                except self._driver.Error as exc:
                    code = exc.args[0] if exc.args else None
                    match verdict(delay, code in _TRANSIENT, end):
                        case "overran":
                            raise bounds.overran(self.url.display, start, _describe(exc)) from exc
                        case "failed":
                            raise StoreError(
                                f"lock store {self.url.display}: {_describe(exc)}"
                            ) from exc
                        case float(pause):
                            self.stats.add("retries")
                            time.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

    def _execute(self, conn: Connection, text: str, params: Params | None = None) -> list[Row]:
        self.stats.add("statements")
        bound = _bound(params or {})
        with conn.cursor() as cur:
            if returning := _UPDATE_RETURNING.match(text):
                # No UPDATE ... RETURNING: the shared statements return only
                # constants from an UPDATE, one row per row it matched.
                matched: int = cur.execute(returning[1], bound)
                if not matched:
                    return []
                cur.execute(f"SELECT {returning[2]}", bound)
                constants: list[Row] = list(cur.fetchall())
                return constants * matched
            cur.execute(text, bound)
            rows: list[Row] = list(cur.fetchall()) if cur.description else []
            return rows

    def _transaction(self, work: Callable[[Connection, Run], T], names: Sequence[str] = ()) -> T:
        """Run ``work`` in one transaction, first locking the bucket rows of ``names``.

        The rows are locked in bucket order (so acquirers never deadlock on
        them), by the statement that opens the transaction (one round trip).
        """
        begin = _begin(names)

        def run_in(conn: Connection) -> T:
            def run(sql: str, params: Params | None = None) -> list[Row]:
                return self._execute(conn, self.dialect.render(sql), params)

            self.stats.add("statements")
            with conn.cursor() as cur:
                cur.execute(begin)
                while cur.nextset():
                    pass
            result = work(conn, run)
            self._execute(conn, "COMMIT")
            return result

        return self._run(run_in)

    def _in_transaction(self, work: Callable[[Run], T]) -> T:
        """Migrations: one process at a time, under a named lock (DDL commits as it goes)."""
        database = str(self._options["database"])
        key = "lockwarden-" + hashlib.sha1(database.encode()).hexdigest()[:40]

        def run_in(conn: Connection) -> T:
            def run(sql: str, params: Params | None = None) -> list[Row]:
                return self._execute(conn, self.dialect.render(sql), params)

            got = self._execute(conn, "SELECT GET_LOCK(%(key)s, 60) AS got", {"key": key})
            if not got[0]["got"]:
                raise StoreError(
                    f"lock store {self.url.display}: another process has been creating or "
                    "upgrading the tables for a minute; try again"
                )
            result = work(run)
            # After a failure the pool closes the connection, which frees the lock.
            self._execute(conn, "DO RELEASE_LOCK(%(key)s)", {"key": key})
            return result

        return self._run(run_in)

    def _engine(self, conn: Connection) -> Engine:
        def reserve(run: Run, counter: str, n: int) -> int:
            self.stats.add("statements")
            with conn.cursor() as cur:
                cur.execute(self.dialect.render(_RESERVE), {"key": counter, "n": n})
                last: int = cur.lastrowid
            return last - n + 1

        def grant_head(run: Run, name: str) -> list[Row]:
            self.stats.add("statements")
            with conn.cursor() as cur:
                cur.execute(_GRANT_HEAD, _bound({"name": name}))
                cur.nextset()
                return list(cur.fetchall())

        return Engine(
            reserve=reserve, lock_graph=self._lock_graph, try_lock=_try_lock, grant_head=grant_head
        )

    def _lock_graph(self, run: Run) -> None:
        run("SELECT id FROM lw_buckets WHERE id = :graph FOR UPDATE", {"graph": GRAPH_KEY})

    def query(self, sql: str, params: Params | None = None, *, write: bool = False) -> list[Row]:
        text = self.dialect.render(sql)
        return self._run(lambda conn: self._execute(conn, text, params))

    def change(self, statements: Sequence[str], params: Params) -> list[list[str | None]]:
        def work(conn: Connection, run: Run) -> tuple[list[list[str | None]], int]:
            found = [[row["name"] for row in run(sql, params)] for sql in statements]
            if not any(name is not None for names in found for name in names):
                return found, 0
            # These changes do not lock the names' buckets, so a waiter may be
            # queueing unseen right now: every doorbell rings (as PostgreSQL's
            # NOTIFY reaches every listener), and each process looks.
            return found, self._ring(conn, "TRUE", {})

        found, rung = self._transaction(work)
        self.wakeups.wake({name for names in found for name in names if name is not None})
        if rung:
            self._knock("TRUE", {})
        return found

    def fence_advance(
        self,
        *,
        resource: str,
        token: int,
        value: str | None,
        write: bool,
        session: str | None,
        request: str | None,
    ) -> list[Row]:
        """The shared statement's compare-and-set as a row lock and two statements: MySQL's
        upsert can neither be conditional nor return rows."""
        params = {"resource": resource, "token": token, "value": value, "write": write}
        params |= {"session": session, "request": request}

        def work(conn: Connection, run: Run) -> list[Row]:
            run(_FENCE_ENSURE, params)
            row = run(_FENCE_LOCK, params)[0]
            newest: int = row["token"] if write else row["written"]
            if newest > token:
                return []
            if request is not None and not run(queries.FENCE_HELD, params)[0]["n"]:
                return []  # the access carries its lock, and the lock is gone
            run(_FENCE_SET, params)
            return run(queries.FENCE_READ, params)

        return self._transaction(work)

    # -- the lock algorithm ----------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> Attempt:
        self.stats.add("attempts")
        # A free name is granted in one round trip, and on a name fought over the common
        # wait is queued in it; otherwise the full algorithm decides (a queued request has
        # been found blocked before: it goes there at once).
        single = len(request.names) == 1 and not request.queued
        if single and (found := self._take_idle(request, request.names[0])) is not None:
            self._contended.note(request.names, found.status != "granted")
            return found
        woken: set[str] = set()

        def work(conn: Connection, run: Run) -> tuple[Attempt, int]:
            woken.clear()  # a retried transaction starts afresh
            found = attempt(run, request, woken, self._engine(conn))
            assert found is not None  # allowed to write, every path ends in an Attempt
            # Reclaimed or refused under the names' locks: ring only who waits.
            rung = self._ring(conn, _WAITING_PROCESS, {"names": sorted(woken)}) if woken else 0
            return found, rung

        found, rung = self._transaction(work, request.names)
        if single:
            self._contended.note(request.names, found.status != "granted")
        if woken:
            self.wakeups.wake(woken)
        if rung:
            self._knock(_WAITING_PROCESS, {"names": sorted(woken)})
        return found

    def _take_idle(self, request: AcquireRequest, name: str) -> Attempt | None:
        """`_taking`: the grant of a free name, the request queued without the rows in
        its way (on a name fought over), or None if neither (nothing was written)."""
        fought = request.enqueue and name in self._contended
        text = f"{_begin([name])}; {_TAKE_OR_QUEUE if fought else _TAKE_IDLE}"
        bound = {
            "session": request.session_id,
            "request": request.request_id,
            "name": name,
            "mode": request.modes[0],
            "enqueue": request.enqueue,
            "wait": request.wait,
        }

        def work(conn: Connection) -> Attempt | None:
            [answer] = self._each_result(conn, text, bound)[-2]  # before the COMMIT's
            if answer["idle"]:
                return Attempt("granted", {name: int(answer["value"])})
            if answer["queued"]:
                return Attempt("blocked", rows=None, seq=int(answer["value"]))
            return None

        return self._run(work)

    def _each_result(self, conn: Connection, text: str, bound: Params) -> list[list[Row]]:
        """Send statements joined by ``;`` as one request (one round trip); the rows of
        each, in order (none for a statement that returns no rows)."""
        self.stats.add("statements")
        found: list[list[Row]] = []
        with conn.cursor() as cur:
            cur.execute(text, bound)
            while True:
                found.append(list(cur.fetchall()) if cur.description else [])
                if not cur.nextset():
                    return found

    def _release_contended(
        self, session_id: str, request_id: str, names: Sequence[str]
    ) -> tuple[int, int]:
        params = {"session": session_id, "request": request_id, "names": names}
        # The first round trip opens the transaction, locks the buckets, deletes the
        # grant and any queue entries, and asks whether anyone waits for the names.
        # Holding the names' locks, no waiter can queue unseen before the commit:
        # a release nobody waits for is that and its commit.
        text = f"{_begin(names)}; {_RELEASE}"
        bound = _bound(params)
        sent = 0

        def work(conn: Connection) -> tuple[int, list[Told], int, set[str]]:
            nonlocal sent
            sent += 1
            found = self._each_result(conn, text, bound)
            released, queued = len(found[-3]), len(found[-1])
            told: list[Told] = []
            rung, near = 0, set[str]()
            if queued:
                # The waiters the release lets in are granted here, in queue order, and
                # only they are told (design note, "Release").
                def run(sql: str, values: Params | None = None) -> list[Row]:
                    return self._execute(conn, self.dialect.render(sql), values)

                told = grant(run, names, self._engine(conn))
            if told:
                rung, near = self._ring_far_and_commit(conn, _sessions(told))
            else:
                self._execute(conn, "COMMIT")
            return released, told, rung, near

        deleted, told, rung, near = self._run(work)
        self._contended.note(names, bool(told))
        # After the commit: a woken waiter holds its grant.
        here = [t for t in told if t[1] in near or t[1].endswith(self._tag)]
        if unreached := inbox.tell(here, self._tag, self.wakeups, self._outbox):
            self._ring_now(_sessions(unreached))
        if rung:
            self._knock(_SESSION_PROCESS, {"sessions": _sessions(told), "near": self._near})
        return deleted, sent

    def _release_idle(self, session_id: str, request_id: str, name: str) -> tuple[bool, bool]:
        """`queries.RELEASE_IDLE` in the round trip that opens its transaction, locks the
        name's bucket (a waiter queueing meanwhile is seen) and commits: whether it
        released the name, and whether it was resent after its connection dropped. If it
        did not (someone waits, nothing was held, or a first sending committed), nothing
        changed and the full release decides."""
        text = f"{_begin([name])}; {_RELEASE_IDLE}; COMMIT"
        bound = {"session": session_id, "request": request_id, "name": name}
        sent = 0

        def work(conn: Connection) -> bool:
            nonlocal sent
            sent += 1
            return bool(self._each_result(conn, text, bound)[-2])  # the delete's row

        return self._run(work), sent > 1

    # -- wake-ups --------------------------------------------------------------------

    def _ring(self, conn: Connection, who: str, params: Params) -> int:
        """Ring the doorbells of other processes (``who``: which) in the transaction on
        ``conn``; returns how many rang. Their listeners see it once it commits."""
        self.stats.add("statements")
        text = self.dialect.render(_RING.format(who=who))
        with conn.cursor() as cur:
            rung: int = cur.execute(text, _bound({**params, "me": self._tag}))
        return rung

    def _ring_far_and_commit(self, conn: Connection, sessions: list[str]) -> tuple[int, set[str]]:
        """Ring the doorbells of the processes of ``sessions`` on other machines, say which
        of ``sessions`` are of this machine (to be poked once committed), and commit the
        transaction on ``conn``, in one round trip: how many rang, and those sessions."""
        self.stats.add("statements")
        params = {"sessions": sessions, "near": self._near, "me": self._tag}
        near = self._near is not None
        with conn.cursor() as cur:
            rung: int = cur.execute(_RING_TOLD_NEAR if near else _RING_TOLD_ALL, _bound(params))
            cur.nextset()
            return rung, {row["id"] for row in cur.fetchall()} if near else set()

    def _ring_now(self, sessions: list[str]) -> None:
        """Ring the doorbells of the processes of ``sessions`` that a poke did not reach
        (the release has committed), and interrupt their sleep. The ring is a transaction
        of its own (autocommit: one statement, so a pause of this process between two
        statements can hold no doorbell row). The release stands whatever happens here:
        at worst those waiters ask within `inbox.LOOK_EVERY`."""
        params = {"sessions": sessions, "near": None}
        with suppress(StoreError):
            if self._run(lambda conn: self._ring(conn, _SESSION_PROCESS, params)):
                self._knock(_SESSION_PROCESS, params)

    def _knock(self, who: str, params: Params) -> None:
        """After the ring committed: interrupt the sleep of the doorbells' listeners, from
        the store's knocking thread. The rung processes need the knock, not the caller,
        which must not wait for it: a `KILL QUERY` may take seconds (MySQL design note,
        "Wake-ups")."""
        with self._knocker_lock:
            if self._knocker is None or not self._knocker.is_alive():
                self._knocker = threading.Thread(
                    target=self._knocking, name="lockwarden-knock", daemon=True
                )
                self._knocker.start()
        self._knocks.put((who, params))

    def _knocking(self) -> None:
        """Send the knocks asked for, in order, until `close` asks for no more (None)."""
        while (knock := self._knocks.get()) is not None:
            try:
                self._knock_now(*knock)
            except StoreError:  # the rung listeners see the ring when they next read it
                self.stats.add("rings_unheard")

    def _knock_now(self, who: str, params: Params) -> None:
        bound = {**params, "me": self._tag}
        for row in self.query(_LISTENING.format(who=who), bound):
            try:
                self.query(f"KILL QUERY {int(row['conn_id'])}")
            except StoreError:
                # Gone meanwhile, or (another database user) not ours to kill: that
                # process finds the ring when its listener next reads its doorbell.
                self.stats.add("rings_unheard")

    def _watch(self, timeout: float | None) -> None:
        # If the doorbell cannot be hung, the listener's retries wake every waiter
        # (polling). Hanging it may wait for a connection, or for the doorbell's row (a
        # ring in another transaction holds it to its commit).
        self._listener.start(timeout)

    def _listen(self) -> None:
        me = {"me": self._tag}
        failures = 0
        while not self._closed.is_set():
            try:
                conn = self._connect()
                try:
                    self._execute(
                        conn,
                        DIALECT.render(_DOORBELL_HANG),
                        {**me, "host": socket.gethostname(), "pid": os.getpid()},
                    )
                    self._listen_conn = conn.thread_id()
                    seen = self._listen_once(conn, None)
                    # Rings while nobody listened were missed: everyone looks again.
                    self.wakeups.wake_all()
                    self._listener.tried.set()
                    failures = 0
                    while not self._closed.is_set():
                        now = self._listen_once(conn, seen)
                        if now != seen:  # rung (None: interrupted before reading the count)
                            seen = seen if now is None else now
                            self.wakeups.wake_all()
                finally:
                    conn.close()
            except self._driver.Error as exc:
                pause = self._listener.failed(
                    failures,
                    f"lock store {self.url.display}: no doorbell, waiters poll until it hangs "
                    f"again: {_describe(exc)}",
                )
                failures += 1
                self._closed.wait(pause)

    def _listen_once(self, conn: Connection, seen: int | None) -> int | None:
        """Sleep on the doorbell until it rings (``seen``: the count last seen; None: just
        read it), handing on meanwhile each poke that reaches the inbox. Returns the ring
        count, or None if the sleep was cut short unread."""
        self.stats.add("statements")
        params = {"me": self._tag, "seen": -1 if seen is None else seen, "nap": _NAP}
        with conn.cursor() as cur:
            text: str = cur.mogrify(DIALECT.render(_DOORBELL_LISTEN), params)
        # PyMySQL's `query`, in its two halves: send, then (once the answer is there) read.
        conn._execute_command(self._driver.constants.COMMAND.COM_QUERY, text.encode())
        box = self._listener.inbox
        answer = _socket(conn)
        while box is not None:  # hand on the pokes that come before the answer
            ready = select.select([answer, box], [], [])[0]
            if box in ready:
                self._listener.hand_on([box])
            if answer in ready:
                break
        try:
            conn._read_query_result()  # a KILL may land here
            rows = conn._result.rows  # (rings, slept)
        except self._driver.OperationalError as exc:
            if exc.args and exc.args[0] == _KILLED:
                return None
            raise
        if not rows:  # someone removed our doorbell: hang it again
            raise self._driver.OperationalError(2013, "the doorbell row disappeared")
        rings: int = rows[0][0]
        return rings

    def close(self) -> None:
        self._closed.set()
        if self._knocker is not None:  # the knocks asked for before are still sent
            self._knocks.put(None)
            self._knocker.join(timeout=5.0)
        started = self._listener.started
        for _ in range(5):  # a KILL that lands between two sleeps is lost: send another
            if self._listen_conn is None or not started:
                break
            with suppress(StoreError):  # already gone
                self.query(f"KILL QUERY {int(self._listen_conn)}")
            if self._listener.join(1.0):
                break
        self._listener.close(timeout=1.0)
        if started:
            with suppress(StoreError):  # the server is gone: the row stays, never rung
                self.query(_DOORBELL_REMOVE, {"me": self._tag})
        self._pool.close()
        self._outbox.close()


def _begin(names: Sequence[str]) -> str:
    """Open a transaction and lock the bucket rows of ``names`` (in bucket order, so that
    acquirers never deadlock on them), in one round trip."""
    if not names:
        return "START TRANSACTION"
    return f"START TRANSACTION; {_lock_buckets(names)}"


def _try_lock(run: Run, names: Sequence[str]) -> bool:
    """Lock the bucket rows of ``names`` if none is locked by another transaction
    (`Engine.try_lock`): taken out of bucket order, they are never waited for."""
    return len(run(_lock_buckets(names, " SKIP LOCKED"))) == len({bucket(n) for n in names})


def _lock_buckets(names: Sequence[str], wait: str = "") -> str:
    """The statement locking the bucket rows of ``names`` (``wait``: " SKIP LOCKED" to
    pass over rows another transaction holds); the ids are computed, never given."""
    ids = ", ".join(map(str, sorted({bucket(name) for name in names})))
    return f"SELECT id FROM lw_buckets WHERE id IN ({ids}) ORDER BY id FOR UPDATE{wait}"


def _sessions(told: Sequence[Told]) -> list[str]:
    return sorted({session for _, session, _ in told})


def _bound(params: Params) -> dict[str, object]:
    """Lists (a request's names and modes) travel as JSON text, read by JSON_TABLE."""
    return {k: json.dumps(v) if isinstance(v, list | tuple) else v for k, v in params.items()}


class _Overran(Exception):
    """A call's time ran out: its connection was shut down under it (`MySQLBackend._run`)."""


def _tls(options: dict[str, object]) -> dict[str, object]:
    """The driver's TLS arguments for the URL's ``ssl`` parameters (popped from ``options``).

    ``ssl=true`` alone: encrypted, the server's certificate not checked (MySQL's
    ``REQUIRED``); ``ssl_ca``: the certificate checked against that authority
    (``VERIFY_CA``); ``ssl_cert`` and ``ssl_key``: the client's own. Without any:
    no TLS (the driver would otherwise try it and fall back to plain text unseen).
    """
    wanted = options.pop("ssl", False)
    files: dict[str, object] = {
        k: options.pop(k) for k in ("ssl_ca", "ssl_cert", "ssl_key") if k in options
    }
    if files:
        return {**files, "ssl_verify_cert": "ssl_ca" in files}
    if wanted:
        return {"ssl": {"check_hostname": False, "verify_mode": False}}
    return {"ssl_disabled": True}


_KEEPALIVE: Final = tuple(
    (option, value)
    for name, value in (
        ("TCP_KEEPIDLE", 5),
        ("TCP_KEEPINTVL", 2),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", 10_000),
    )
    if (option := getattr(socket, name, None)) is not None
)
"""PostgreSQL's connections' keepalive settings (`postgresql/url.py`, `_DEFAULTS`), where
the platform has them: the doorbell's connection waits in the server for minutes, and a
server gone silent (a partition, a frozen host) is found in about 11 s rather than the
system's two hours; data unacknowledged for 10 s ends a connection."""


def _dial(options: dict[str, object], wait: float) -> socket.socket:
    """A socket connected to the server of ``options`` within ``wait`` seconds, blocking."""
    path = options.get("unix_socket")
    if isinstance(path, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(wait, 0.001))
            sock.connect(path)
        except OSError:
            sock.close()
            raise
    else:
        host, port = options["host"], options["port"]
        assert isinstance(host, str) and isinstance(port, int)  # `mysql_options` made them
        sock = socket.create_connection((host, port), timeout=max(wait, 0.001))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in _KEEPALIVE:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    sock.settimeout(None)  # from here on the cutter bounds each wait
    return sock


def _socket(conn: Connection) -> socket.socket:
    """The connection's socket (the cutter shuts it down; the doorbell waits on it)."""
    sock: socket.socket = conn._sock
    return sock


def _close(conn: Connection) -> None:
    conn.close()


def _describe(exc: Exception) -> str:
    args = exc.args
    if len(args) == 2:  # the driver's (code, message)
        return f"({args[0]}) {args[1]}"
    return str(exc) or type(exc).__name__
