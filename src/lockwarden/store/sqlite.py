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

import sqlite3
import threading
from collections.abc import Callable, Sequence
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

_NEXT_TOKENS = "UPDATE lw_meta SET value = value + :n WHERE key = 'token' RETURNING value"
_NEXT_SEQ = "UPDATE lw_meta SET value = value + 1 WHERE key = 'seq' RETURNING value"


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Row:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


class SQLiteBackend(Backend):
    dialect = queries.SQLITE

    def __init__(self, url: StoreURL) -> None:
        super().__init__(url)
        self._pool: Pool[sqlite3.Connection] = Pool(self._connect, sqlite3.Connection.close)
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
        return conn.execute(self.dialect.render(sql), params or {}).fetchall()

    def _in_transaction(self, work: Callable[[Run], T]) -> T:
        def run_in(conn: sqlite3.Connection) -> T:
            def run(sql: str, params: Params | None = None) -> list[Row]:
                return self._execute(conn, sql, params)

            conn.execute("BEGIN IMMEDIATE")
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
        attempt = self._in_transaction(lambda run: _acquire(run, request, woken))
        self.wakeups.wake(woken)
        return attempt

    def release(self, session_id: str, request_id: str, names: Sequence[str]) -> int:
        params = {"session": session_id, "request": request_id}

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


def _acquire(run: Run, request: AcquireRequest, woken: set[str]) -> Attempt:
    """One attempt (design note, "Acquire"); `plpgsql` holds the same steps for PostgreSQL."""
    params: dict[str, object] = {
        "session": request.session_id,
        "request": request.request_id,
        "refuse": request.refuse,
        "wait": request.wait,
    }
    state = run(queries.ACQUIRE_STATE, params)[0]
    if state["granted"]:  # a retry of a request whose first attempt committed
        granted = {row["name"]: row["token"] for row in run(queries.GRANTED, params)}
        return Attempt("granted", tuple(granted[name] for name in request.names))
    if not state["live"]:
        return Attempt("lost")
    params["seq"] = state["seq"]

    rows: list[Row] = []
    reclaimed = False
    for name, mode in zip(request.names, request.modes, strict=True):
        params.update(name=name, mode=mode)
        while True:
            found = run(queries.IN_THE_WAY, params)
            if not any(r["kind"] == "holder" and not r["live"] for r in found) or request.refuse:
                break
            run(queries.RECLAIM_EXPIRE, params)
            if run(queries.RECLAIM_DELETE, params):
                reclaimed = True
                woken.add(name)
        rows.extend(dict(r, name=name) for r in found)

    if not rows:
        last = run(_NEXT_TOKENS, {"n": len(request.names)})[0]["value"]
        tokens = tuple(range(last - len(request.names) + 1, last + 1))
        for name, mode, token in zip(request.names, request.modes, tokens, strict=True):
            run(queries.INSERT_HOLDER, params | {"name": name, "mode": mode, "token": token})
        if state["seq"] is not None:
            run(queries.DEQUEUE, params)
        return Attempt("granted", tokens, reclaimed=reclaimed)

    if request.enqueue:
        if params["seq"] is None:
            params["seq"] = run(_NEXT_SEQ)[0]["value"]
            for name, mode in zip(request.names, request.modes, strict=True):
                run(queries.INSERT_WAITER, params | {"name": name, "mode": mode})
        if run(queries.HOLDS_ANY, params)[0]["holds"]:
            edges = run(queries.DEADLOCK_EDGES, params)
            if edges:
                run(queries.DEQUEUE, params)
                woken.update(request.names)
                return Attempt("deadlock", edges=tuple((e["src"], e["dst"]) for e in edges))
    return Attempt("blocked", reclaimed=reclaimed, rows=tuple(rows))
