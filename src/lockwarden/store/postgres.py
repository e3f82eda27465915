"""The PostgreSQL backend: a connection pool, the lock functions, the LISTEN thread.

Acquire and release are one call each to the PL/pgSQL functions of
`plpgsql` (one round trip). Wake-ups come by NOTIFY on a channel named after
the schema; one LISTEN connection per store hands them to local waiters.
Connection failures are retried a bounded number of times, with the same
request id, so a retried acquire is recognised rather than granted twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

from lockwarden.errors import StoreError
from lockwarden.store import plpgsql, queries
from lockwarden.store.backend import AcquireRequest, Attempt, Backend, Params, Pool, Row, Run
from lockwarden.store.url import StoreURL

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[Row]

T = TypeVar("T")

RETRY_DELAYS = (0.05, 0.2, 0.8)
"""Pauses before each retry of a statement whose connection failed."""

_LISTEN_POLL = 0.2
"""How long the listener waits for a notification before checking whether the store closed.

This is a local wait on the socket, not a query: no statement is sent.
"""

_ACQUIRE = (
    "SELECT {p}lw_acquire(:session, :request, :names::text[], :modes::text[],"
    " :enqueue, :refuse, :wait, :relaxed) AS result"
)
_RELEASE = "SELECT {p}lw_release(:session, :request, :names::text[], :relaxed) AS deleted"


def _import_psycopg() -> Any:
    try:
        import psycopg  # noqa: PLC0415  (an optional dependency)
    except ImportError as exc:
        raise StoreError(
            "PostgreSQL stores need the psycopg driver: pip install 'lockwarden[postgres]'"
        ) from exc
    return psycopg


class PostgresBackend(Backend):
    def __init__(self, url: StoreURL, *, relaxed: bool) -> None:
        super().__init__(url)
        self._psycopg = _import_psycopg()
        self.dialect = queries.postgres(url.schema)
        self.relaxed = relaxed
        self._pool: Pool[Connection] = Pool(self._connect, _close)
        self._closed = threading.Event()
        self._listening = threading.Event()
        self._listen_tried = threading.Event()
        self._listen_error = ""
        self._listener: threading.Thread | None = None
        self._listener_lock = threading.Lock()
        self._migrate((f"CREATE SCHEMA IF NOT EXISTS {url.schema}",), plpgsql.steps(url.schema))

    def _connect(self) -> Connection:
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415
        from psycopg.rows import dict_row  # noqa: PLC0415

        # "lockwarden" names the connections in pg_stat_activity, unless the URL
        # names them itself (a keyword argument would override the URL's).
        named = "application_name" in conninfo_to_dict(self.url.target)
        conn: Connection = self._psycopg.connect(
            self.url.target,
            autocommit=True,
            row_factory=dict_row,
            **({} if named else {"application_name": "lockwarden"}),
        )
        return conn

    # -- running statements ----------------------------------------------------------

    def _run(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` on a pooled connection; retry it on a fresh one if the connection failed."""
        psycopg = self._psycopg
        for delay in (*RETRY_DELAYS, None):
            conn: Connection | None = None
            try:
                with self._pool.connection() as conn:
                    return work(conn)
            except psycopg.Error as exc:
                if delay is None or not _transient(exc, conn):
                    raise StoreError(f"lock store {self.url.display}: {_describe(exc)}") from exc
                self.stats.add("retries")
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _execute(self, conn: Connection, text: str, params: Params | None) -> list[Row]:
        self.stats.add("statements")
        cur = conn.execute(text, params or {})
        return cur.fetchall() if cur.description else []

    def _in_transaction(self, work: Callable[[Run], T]) -> T:
        def run_in(conn: Connection) -> T:
            def run(sql: str, params: Params | None = None) -> list[Row]:
                return self._execute(conn, self.dialect.render(sql), params)

            with conn.transaction():
                run(
                    "SELECT pg_advisory_xact_lock(:key, :part)",
                    {"key": plpgsql.lock_key(self.url.schema), "part": plpgsql.MIGRATION_KEY},
                )
                return work(run)

        return self._run(run_in)

    def query(self, sql: str, params: Params | None = None, *, write: bool = False) -> list[Row]:
        text = self.dialect.render(sql)
        return self._run(lambda conn: self._execute(conn, text, params))

    def change(self, statements: Sequence[str], params: Params) -> list[list[str | None]]:
        rows = self.query(_notifying(tuple(statements), plpgsql.channel(self.url.schema)), params)
        found: list[list[str | None]] = [[] for _ in statements]
        for row in rows:
            found[row["i"]].append(row["name"])
        return found

    # -- the lock functions ----------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> Attempt:
        self.stats.add("attempts")
        rows = self.query(
            _ACQUIRE,
            {
                "session": request.session_id,
                "request": request.request_id,
                "names": list(request.names),
                "modes": list(request.modes),
                "enqueue": request.enqueue,
                "refuse": request.refuse,
                "wait": request.wait,
                "relaxed": self.relaxed,
            },
        )
        return Attempt.from_dict(rows[0]["result"])

    def release(self, session_id: str, request_id: str, names: Sequence[str]) -> int:
        text = self.dialect.render(_RELEASE)
        params = {
            "session": session_id,
            "request": request_id,
            "names": list(names),
            "relaxed": self.relaxed,
        }
        sent = 0

        def work(conn: Connection) -> int:
            nonlocal sent
            sent += 1
            return int(self._execute(conn, text, params)[0]["deleted"])

        deleted = self._run(work)
        # A release resent after its connection dropped finds nothing when the
        # first one committed; it cannot tell that from a lock lost meanwhile,
        # and the first is by far the likelier, so it counts as released.
        return len(names) if sent > 1 and deleted == 0 else deleted

    # -- wake-ups --------------------------------------------------------------------

    def _watch(self) -> None:
        if self._listening.is_set():
            return
        with self._listener_lock:
            if self._listener is None:
                self._listener = threading.Thread(
                    target=self._listen, name="lockwarden-listen", daemon=True
                )
                self._listener.start()
        # A waiter must not make its first attempt before LISTEN is in force,
        # or a release committed in between would go unheard.
        self._listen_tried.wait()
        if not self._listening.is_set():
            raise StoreError(
                f"lock store {self.url.display}: cannot LISTEN for wake-ups: {self._listen_error}"
            )

    def _listen(self) -> None:
        psycopg = self._psycopg
        failures = 0
        while not self._closed.is_set():
            try:
                conn = self._connect()
                try:
                    conn.execute(f"LISTEN {plpgsql.channel(self.url.schema)}")
                    # Notifications sent while nobody listened are lost: everyone looks again.
                    self.wakeups.wake_all()
                    self._listening.set()
                    self._listen_tried.set()
                    failures = 0
                    while not self._closed.is_set():
                        for note in conn.notifies(timeout=_LISTEN_POLL):
                            self.wakeups.wake((note.payload,))
                finally:
                    conn.close()
            except psycopg.Error as exc:
                self._listen_error = _describe(exc)
                self._listen_tried.set()
                self.stats.add("listener_reconnects")
                self.wakeups.wake_all()  # let waiters look (and meet the trouble themselves)
                failures += 1
                self._closed.wait(min(0.05 * 2**failures, 2.0))

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            self._listener.join(timeout=2 * _LISTEN_POLL + 1.0)
        self._pool.close()


def _close(conn: Connection) -> None:
    conn.close()


@cache
def _notifying(statements: tuple[str, ...], channel: str) -> str:
    """One statement running ``statements`` together and notifying every name they return.

    Data-modifying CTEs all run, on one snapshot, whether referenced or not.
    """
    parts = [f"c{i} AS ({sql})" for i, sql in enumerate(statements)]
    union = " UNION ALL ".join(f"SELECT {i} AS i, name FROM c{i}" for i in range(len(statements)))
    return (
        f"WITH {', '.join(parts)}, changed AS ({union}), "
        f"woken AS (SELECT pg_notify('{channel}', name) FROM "
        "(SELECT DISTINCT name FROM changed WHERE name IS NOT NULL) AS n) "
        "SELECT i, name FROM changed, (SELECT count(*) FROM woken) AS w"
    )


def _transient(exc: Exception, conn: Connection | None) -> bool:
    """Whether trying again on a fresh connection may succeed.

    A dropped or refused connection, or a transaction the server rolled back
    for a concurrency reason. Not: bad credentials, bad SQL, a full disk.
    """
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in ("40001", "40P01"):  # serialization failure, deadlock detected
        return True
    if conn is not None and (conn.closed or conn.broken):
        return True
    if conn is None:  # could not connect: retry a refused or reset connection, not a rejected login
        return sqlstate is None or sqlstate.startswith(("08", "57P"))
    return False


def _describe(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
