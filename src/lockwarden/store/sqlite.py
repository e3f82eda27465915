"""The SQLite backend: the acquire algorithm in Python, under ``BEGIN IMMEDIATE``.

SQLite has one writer at a time, so a write transaction serializes every
request on the store (the role PostgreSQL's per-name advisory locks play).
The algorithm is the design note's, step for step, with the same shared
statements the PL/pgSQL function runs. The file is in WAL mode with
``synchronous=FULL``: a grant is on disk before the caller learns of it.

Wake-ups: a change made through this store wakes its waiters at once; a
change made by another process is seen by a poller that reads ``PRAGMA
data_version`` (which moves whenever another connection commits) every few
milliseconds, backing off to 50 ms, and only while someone waits.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

from lockwarden.errors import StoreError
from lockwarden.store import queries
from lockwarden.store.backend import AcquireRequest, Attempt, Backend, Params, Pool, Row, Run
from lockwarden.store.url import StoreURL

T = TypeVar("T")

BUSY_TIMEOUT = 10.0
"""Seconds a transaction waits for another writer before giving up with StoreError."""

POLL_MIN, POLL_MAX = 0.002, 0.05
"""The cross-process poll interval: short after a change, doubling to the maximum while idle."""

_RESERVE_TOKENS = (
    "UPDATE lw_meta SET value = value + :n WHERE key = 'token' RETURNING value - :n + 1 AS first"
)
_NEXT_SEQ = "UPDATE lw_meta SET value = value + 1 WHERE key = 'seq' RETURNING value"


class _FairLock:
    """A lock granted in arrival order, around this store's write transactions.

    SQLite's busy handler polls with growing sleeps; a thread writing back
    to back would keep winning, and a heartbeat waiting behind it could miss
    its TTL. Ownership passes straight to the longest waiter instead.
    (Writers in other processes still meet SQLite's polling.)
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queue: deque[threading.Lock] = deque()
        self._held = False

    def __enter__(self) -> None:
        with self._mutex:
            if not self._held:
                self._held = True
                return
            gate = threading.Lock()
            gate.acquire()
            self._queue.append(gate)
        gate.acquire()  # released by the holder handing over

    def __exit__(self, *exc: object) -> None:
        with self._mutex:
            if self._queue:
                self._queue.popleft().release()
            else:
                self._held = False


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Row:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


class SQLiteBackend(Backend):
    dialect = queries.SQLITE

    def __init__(self, url: StoreURL) -> None:
        super().__init__(url)
        self._pool: Pool[sqlite3.Connection] = Pool(self._connect, sqlite3.Connection.close)
        self._writing = _FairLock()
        self._closed = threading.Event()
        self._kick = threading.Event()
        self._poller: threading.Thread | None = None
        self._poller_lock = threading.Lock()
        self._migrate((), {1: ["INSERT INTO lw_meta (key, value) VALUES ('token', 0), ('seq', 0)"]})

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.url.target, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = _dict_row
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    # -- running statements ----------------------------------------------------------

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            with self._pool.connection() as conn:
                return work(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"lock store {self.url.display}: {exc}") from exc

    def _execute(self, conn: sqlite3.Connection, sql: str, params: Params | None) -> list[Row]:
        self.stats.add("statements")
        # Lists (a request's names and modes) travel as JSON text, read by json_each.
        bound = {
            k: json.dumps(v) if isinstance(v, list | tuple) else v
            for k, v in (params or {}).items()
        }
        return conn.execute(self.dialect.render(sql), bound).fetchall()

    def _in_transaction(self, work: Callable[[Run], T], *, write: bool = True) -> T:
        """Run ``work`` in a write transaction, or (``write=False``) a read-only one,
        which neither waits for the writer nor makes it wait."""

        def run_in(conn: sqlite3.Connection) -> T:
            def run(sql: str, params: Params | None = None) -> list[Row]:
                return self._execute(conn, sql, params)

            with self._writing if write else nullcontext():
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = work(run)
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return result

        return self._run(run_in)

    def query(self, sql: str, params: Params | None = None, *, write: bool = False) -> list[Row]:
        if write:
            return self._in_transaction(lambda run: run(sql, params))
        return self._run(lambda conn: self._execute(conn, sql, params))

    def change(self, statements: Sequence[str], params: Params) -> list[list[str | None]]:
        found = self._in_transaction(
            lambda run: [[row["name"] for row in run(sql, params)] for sql in statements]
        )
        self.wakeups.wake({name for names in found for name in names if name is not None})
        return found

    # -- the lock algorithm ----------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> Attempt:
        self.stats.add("attempts")
        woken: set[str] = set()
        attempt = None
        if request.queued:
            # A waiter looking again mostly finds itself still blocked: learn
            # that without queueing for the write lock, which only changes need.
            attempt = self._in_transaction(
                lambda run: _acquire(run, request, woken, write=False), write=False
            )
        if attempt is None:
            attempt = self._in_transaction(lambda run: _acquire(run, request, woken, write=True))
            assert attempt is not None  # allowed to write, every path ends in an Attempt
        self.wakeups.wake(woken)
        return attempt

    def release(self, session_id: str, request_id: str, names: Sequence[str]) -> int:
        params = {"session": session_id, "request": request_id, "names": names}

        def work(run: Run) -> int:
            deleted = len(run(queries.RELEASE, params))
            run(queries.DEQUEUE, params)
            return deleted

        deleted = self._in_transaction(work)
        self.wakeups.wake(names)
        return deleted

    # -- wake-ups from other processes -----------------------------------------------

    def _watch(self) -> None:
        with self._poller_lock:
            if self._poller is None:
                self._poller = threading.Thread(
                    target=self._poll, name="lockwarden-sqlite-poll", daemon=True
                )
                self._poller.start()
        self._kick.set()  # someone starts waiting: poll briskly again

    def _poll(self) -> None:
        conn: sqlite3.Connection | None = None
        version = None
        interval = POLL_MIN
        while not self._closed.is_set():
            kicked = self._kick.wait(interval if self.wakeups.waiting else None)
            self._kick.clear()
            if kicked:
                interval = POLL_MIN
            if self._closed.is_set() or not self.wakeups.waiting:
                continue
            try:
                conn = conn or self._connect()
                now = conn.execute("PRAGMA data_version").fetchone()["data_version"]
            except sqlite3.Error:
                conn = None
                now = None  # let the waiters look, and meet the trouble themselves
            if now != version or now is None:
                version = now
                interval = POLL_MIN
                self.wakeups.wake_all()
            else:
                interval = min(interval * 2, POLL_MAX)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self._kick.set()
        if self._poller is not None:
            self._poller.join(timeout=1.0)
        self._pool.close()


def _acquire(run: Run, request: AcquireRequest, woken: set[str], *, write: bool) -> Attempt | None:
    """One attempt (design note, "Acquire"); `plpgsql` holds the same steps for PostgreSQL.

    Without ``write``, returns None as soon as the attempt would change anything.
    """
    params: dict[str, object] = {
        "session": request.session_id,
        "request": request.request_id,
        "names": request.names,
        "modes": request.modes,
        "refuse": request.refuse,
        "wait": request.wait,
    }
    state = run(queries.ACQUIRE_STATE, params)[0]
    if state["granted"]:  # a retry of a request whose first attempt committed
        return Attempt("granted", _tokens(run(queries.GRANTED, params)))
    if not state["live"]:
        return Attempt("lost")
    params["seq"] = state["seq"]

    reclaimed = False
    rows: list[Row] = []
    while not state["idle"]:
        rows = [
            row
            for name, mode in zip(request.names, request.modes, strict=True)
            for row in run(queries.IN_THE_WAY, params | {"name": name, "mode": mode})
        ]
        if request.refuse or not any(r["kind"] == "holder" and not r["live"] for r in rows):
            break
        if not write:
            return None
        run(queries.RECLAIM_EXPIRE, params)
        if gone := run(queries.RECLAIM_DELETE, params):
            reclaimed = True
            woken.update(row["name"] for row in gone)

    if not write and (not rows or (request.enqueue and params["seq"] is None)):
        return None
    if not rows:
        first = run(_RESERVE_TOKENS, {"n": len(request.names)})[0]["first"]
        tokens = _tokens(run(queries.INSERT_HOLDERS, params | {"first_token": first}))
        if state["seq"] is not None:
            run(queries.DEQUEUE, params)
        return Attempt("granted", tokens, reclaimed=reclaimed)

    if request.enqueue:
        if params["seq"] is None:
            params["seq"] = run(_NEXT_SEQ)[0]["value"]
            run(queries.INSERT_WAITERS, params)
        if run(queries.HOLDS_ANY, params)[0]["holds"]:
            edges = run(queries.DEADLOCK_EDGES, params)
            if edges:
                if not write:
                    return None
                run(queries.DEQUEUE, params)
                woken.update(request.names)
                return Attempt("deadlock", edges=tuple((e["src"], e["dst"]) for e in edges))
    return Attempt("blocked", reclaimed=reclaimed, rows=tuple(rows))


def _tokens(rows: list[Row]) -> dict[str, int]:
    return {row["name"]: row["token"] for row in rows}
