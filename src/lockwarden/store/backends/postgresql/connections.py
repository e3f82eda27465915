"""A PostgreSQL store's connections: one bounded pool, retries with jitter.

Connections per process, per store: at most `POOL_SIZE` pooled ones (one
kept open while idle, the others closed after `POOL_IDLE` seconds unused),
plus the LISTEN connection while anyone waits, plus one short-lived
connection when the store is opened (which reports a bad URL, password or
host at once, with the server's reason, instead of after the pool's wait,
and runs the first statement while the pool opens).
A caller that finds every pooled connection busy waits up to `POOL_WAIT`
seconds for one, and no longer than its call may take; the pool keeps trying
to reconnect in the background (psycopg_pool, with its own jittered backoff)
while the server is away.

Every call ends within the store's call timeout (`bounds`), retries
included: a connection is given at most the time the call has left (libpq's
``connect_timeout``, the URL's if it is shorter), and a statement that has not
answered when the time is up has its socket shut down under it
(`bounds.Cutter`), which ends the driver's wait at once; the connection is
then discarded, and the caller gets a `StoreError` saying the database did
not answer in time.

A statement that failed for a reason that may pass — the connection broke,
the server refused it for now (53300 too many clients, 57P03 starting up or
shutting down, any 08 connection failure), or a serialization failure or
deadlock rolled the transaction back — is tried again on another connection
after `RETRY_DELAYS`, each scaled by a random factor (`jittered`), so that a
fleet of clients does not come back in step after a restart. Then the caller
gets one `StoreError` naming the store (without password) and the cause, with
every form of the password removed from the driver's message.

One pooled connection is kept out of the pool (`Connections.run`): a call
that finds it free uses it without the pool's check-out and return (about
20 µs of client CPU a call; the store's design note, "Cost"); a call that
finds it busy, on another thread, takes one from the pool. It goes back to
the pool whenever a call on it fails, leaves a transaction open, or has
served `KEEP_FOR` seconds, so the pool's own rules (reset, replacement of a
broken connection, lifetime) apply to it as to the others.

The hot path is called through the driver's libpq layer (`Connections.call`):
prepared statements, one or a few sent at once as one transaction (libpq's
pipeline mode), text parameters, the last one's row as text. The wire carries
what a cursor would send (Bind, Execute, then one Sync), and the call releases
the GIL while it waits; what it skips is the cursor's parameter adaptation,
generator-driven I/O and row loading, most of the client's CPU per lock call
(the store's design note, "Cost").
"""

from __future__ import annotations

import math
import os
import select
import threading
import time
from collections.abc import Callable
from contextlib import closing, suppress
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from lockwarden.errors import StoreError
from lockwarden.store import bounds, process
from lockwarden.store.backends.postgresql.url import import_psycopg
from lockwarden.store.retry import RETRY_DELAYS, verdict
from lockwarden.store.url import StoreURL

if TYPE_CHECKING:
    import psycopg
    from psycopg.pq.abc import PGresult
    from psycopg_pool import ConnectionPool

    Connection = psycopg.Connection[dict[str, Any]]

T = TypeVar("T")

POOL_SIZE = 4
"""The most pooled connections a store opens: threads beyond that take turns."""
POOL_WAIT = 10.0
"""Seconds a statement waits for a pooled connection before failing with `StoreError`."""
POOL_IDLE = 60.0
"""Seconds an idle pooled connection above the first is kept."""
KEEP_FOR = 60.0
"""Seconds the kept connection serves before it is given back to the pool (and another,
or the same, taken at the next call)."""
SETTLE = 5.0
"""Seconds a statement whose wait was cut short is given to end, once cancelled."""

TextArgs = list[bytes | None]
"""A prepared statement's parameters, as UTF-8 text (None for NULL)."""
TextRow = tuple[bytes | None, ...]
"""One row of a prepared statement, as UTF-8 text (None for NULL)."""


class Prepared(NamedTuple):
    """A statement `Connections.call` prepares once per connection, under ``name``."""

    name: bytes
    text: bytes


Step = tuple[Prepared, TextArgs]
"""One statement of a `Connections.call`, and its parameters."""


_TRANSIENT = ("08", "57P", "53300", "40001", "40P01")
"""SQLSTATEs (or their classes) worth another try: connection failures, the server
starting or stopping, too many clients, serialization failure, deadlock detected."""


LEAST_CONNECT_TIMEOUT = 2
"""libpq's shortest connect timeout: a smaller ``connect_timeout`` is read as 2 s."""


def describe(url: StoreURL, exc: BaseException) -> str:
    """The first line of a driver's message, with the URL's secrets removed."""
    lines = str(exc).strip().splitlines()
    return url.redact(lines[0]) if lines else type(exc).__name__


class Connections:
    """The pool and the retry rule of one PostgreSQL store.

    Like `base.Pool`, they belong to the process that made them: a forked
    child that uses them gets `LockUsageError` (its copies of the parent's
    connections and of the pool's worker thread are the parent's, or gone).
    """

    def __init__(self, url: StoreURL) -> None:
        self.url = url
        self._pid = os.getpid()
        self._psycopg = import_psycopg()
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415
        from psycopg.rows import dict_row  # noqa: PLC0415  (an optional dependency)
        from psycopg_pool import ConnectionPool  # noqa: PLC0415

        params = conninfo_to_dict(url.target)
        self._hosts = max(
            1, len(str(params.get("host") or params.get("hostaddr") or "").split(","))
        )
        """How many hosts libpq may try in turn (a multi-host URL), each with its own
        ``connect_timeout``."""
        given = params.get("connect_timeout")
        given = given if given is not None else os.environ.get("PGCONNECT_TIMEOUT", "0")
        try:
            seconds = float(given)
        except ValueError:  # libpq says what is wrong with it when it connects
            seconds = 0.0
        self._connect_timeout = seconds if seconds > 0 else math.inf
        """The URL's ``connect_timeout`` (libpq's: 0 or less waits for ever)."""
        # UTF-8 on the wire whatever the database's encoding: `call` encodes and decodes so.
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "client_encoding": "UTF8",
        }
        # Fails fast, with the server's reason, when the store cannot be reached at
        # all; then serves the first statement (the migration) while the pool opens.
        self._first: Connection | None = self.connect()
        self._first_lock = threading.Lock()
        self._kept: Connection | None = None
        self._kept_lock = threading.Lock()
        """Held by the call using the kept connection; a call that cannot have it at once
        takes another from the pool."""
        self._kept_until = 0.0
        self._last_error = ""
        connections = self

        # Defined here: psycopg_pool is imported only by stores that use PostgreSQL.
        class Pool(ConnectionPool["Connection"]):
            def _connect(self, timeout: float | None = None) -> Connection:
                try:
                    conn = super()._connect(timeout)
                except Exception as exc:  # why the pool is empty, for `run`'s message
                    connections._last_error = describe(url, exc)
                    raise
                connections._last_error = ""
                return conn

        self._pool: ConnectionPool[Connection] = Pool(
            url.target,
            connection_class=self._psycopg.Connection,
            kwargs={**self._kwargs, "connect_timeout": self._timeout_of(url.call_timeout)},
            min_size=1,
            max_size=POOL_SIZE,
            timeout=POOL_WAIT,
            max_idle=POOL_IDLE,
            num_workers=1,
            name=f"lockwarden {url.display}",
            open=True,
        )

    def _keep(self, conn: Connection) -> None:
        """Keep ``conn`` for the next call if it is fit to serve one (idle, not due back),
        else give it back to the pool."""
        idle = conn.pgconn.transaction_status == self._psycopg.pq.TransactionStatus.IDLE
        if idle and time.monotonic() < self._kept_until:
            self._kept = conn
        else:
            self._pool.putconn(conn)

    def _drop_kept(self) -> None:
        """Close the kept connection, unless a call is using it: that call drops it when
        done, as it sees the store closed after it lets go of the connection."""
        if self._kept_lock.acquire(blocking=False):
            try:
                kept, self._kept = self._kept, None
            finally:
                self._kept_lock.release()
            if kept is not None:
                self._pool.putconn(kept)  # the pool is closed: it closes the connection

    def _timeout_of(self, left: float) -> int:
        """libpq's ``connect_timeout`` for a connection that must be made within ``left``
        seconds: the URL's if shorter, and never under libpq's least. libpq gives it to
        each host it tries in turn: a silent host first in a multi-host URL (an old
        primary cut off) must leave the others their share."""
        share = left / self._hosts
        return max(LEAST_CONNECT_TIMEOUT, math.ceil(min(self._connect_timeout, share)))

    def connect(self, *, retry: bool = True) -> Connection:
        """A connection of its own (not pooled), made within the call timeout, retried like
        a statement unless ``retry`` is false; `StoreError` if none can be had."""
        began = time.monotonic()
        end = bounds.deadline(self.url.call_timeout)
        for delay in (*(RETRY_DELAYS if retry else ()), None):
            timeout = self._timeout_of(end - time.monotonic())
            try:
                conn: Connection = self._psycopg.connect(
                    self.url.target, **self._kwargs, connect_timeout=timeout
                )
            except self._psycopg.Error as exc:
                match verdict(delay, _transient(exc, None), end):
                    case "overran":
                        raise bounds.overran(
                            self.url.display, began, describe(self.url, exc)
                        ) from None
                    case "failed":
                        raise self.error(exc) from None
                    case float(pause):
                        time.sleep(pause)
            else:
                return conn
        raise AssertionError("unreachable")  # pragma: no cover

    def run(self, work: Callable[[Connection], T], on_retry: Callable[[], object]) -> T:
        """Run ``work`` on the kept connection if it is free, else on a pooled one; retry
        it on another if it failed transiently; all within the call timeout."""
        from psycopg_pool import PoolTimeout  # noqa: PLC0415

        if os.getpid() != self._pid:
            raise process.forked_from(self._pid)
        start = time.monotonic()
        end = bounds.deadline(self.url.call_timeout)
        for delay in (*RETRY_DELAYS, None):
            conn: Connection | None = None
            try:
                if self._first is not None:  # only the store's first statements see it
                    with self._first_lock:
                        conn, self._first = self._first, None
                if conn is not None:
                    with closing(conn):
                        return self._bounded(work, conn, end)
                if not self._pool.closed and self._kept_lock.acquire(blocking=False):
                    try:
                        conn, self._kept = self._kept, None
                        if conn is None:
                            conn = self._pool.getconn(max(0.0, end - time.monotonic()))
                            self._kept_until = time.monotonic() + KEEP_FOR
                        try:
                            result = self._bounded(work, conn, end)
                        except BaseException:
                            self._pool.putconn(conn)  # which resets or replaces it
                            raise
                        self._keep(conn)
                        return result
                    finally:
                        self._kept_lock.release()
                        if self._pool.closed:  # `close` came meanwhile and left it to us
                            self._drop_kept()
                with self._pool.connection(max(0.0, end - time.monotonic())) as conn:
                    return self._bounded(work, conn, end)
            except PoolTimeout as exc:  # the pool has been reconnecting all this time
                why = self._last_error or (
                    f"the {POOL_SIZE} connections of this store were busy, or still being "
                    "made (is the database reachable?)"
                )
                raise StoreError(
                    f"lock store {self.url.display}: no connection within "
                    f"{time.monotonic() - start:.1f} s: {why}"
                ) from exc
            except _Overran:
                raise bounds.overran(self.url.display, start) from None
            except self._psycopg.Error as exc:
                match verdict(delay, _transient(exc, conn), end):
                    case "overran":
                        raise bounds.overran(
                            self.url.display, start, describe(self.url, exc)
                        ) from None
                    case "failed":
                        raise self.error(exc) from None
                    case float(pause):
                        on_retry()
                        time.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

    def _bounded(self, work: Callable[[Connection], T], conn: Connection, end: float) -> T:
        """``work`` on ``conn``, its socket shut down under it if it runs past ``end``
        (`bounds.Cutter`): `_Overran` then."""
        if end <= time.monotonic():
            raise _Overran
        with bounds.CUTTER.watch(conn.pgconn.socket, end) as watched:
            try:
                result = work(conn)
            except self._psycopg.Error:
                if watched.cut:
                    raise _Overran from None
                raise
        if watched.cut:  # it answered as its socket was shut down: of no further use
            conn.close()
        return result

    def call(self, conn: Connection, *steps: Step) -> TextRow | None:
        """Run the prepared ``steps`` on ``conn``, in order, as one transaction in one round
        trip: the first row of the last one, as text values (None if it has none).

        They go in libpq's pipeline mode with one Sync after the last, so the server runs
        them as one transaction that commits at the Sync, each statement seeing what
        committed before it began (a name's advisory lock, then what it guards). Each is
        prepared on the connection the first time the server says it does not know one
        (SQLSTATE 26000: that rolled the transaction back), so a connection new to the
        pool, or one whose prepared statements the server forgot, needs no bookkeeping
        here. A failure is raised as the driver's own exception, which `run` judges as
        any other.
        """
        pq = self._psycopg.pq
        pgconn = conn.pgconn

        def execute() -> int:
            for statement, args in steps:
                # None is NULL, as in the driver's own calls (its stub for this one omits it).
                pgconn.send_query_prepared(statement.name, cast("list[bytes]", args))
            pgconn.pipeline_sync()
            return 1

        def prepare() -> int:  # a Sync each: one already known (42P05) spoils no other
            for statement, _ in steps:
                pgconn.send_prepare(statement.name, statement.text)
                pgconn.pipeline_sync()
            return len(steps)

        ok = pq.ExecStatus.TUPLES_OK
        results = self._exchange(conn, execute)
        if failed := [result for result in results if result.status != ok]:
            # The first failure; the statements after it were skipped.
            if failed[0].error_field(pq.DiagnosticField.SQLSTATE) != b"26000":
                raise self._psycopg.errors.error_from_result(failed[0])
            for result in self._exchange(conn, prepare):
                known = result.error_field(pq.DiagnosticField.SQLSTATE) == b"42P05"
                if result.status != pq.ExecStatus.COMMAND_OK and not known:
                    raise self._psycopg.errors.error_from_result(result)
            results = self._exchange(conn, execute)
            if failed := [result for result in results if result.status != ok]:
                raise self._psycopg.errors.error_from_result(failed[0])
        last = results[-1]
        return tuple(last.get_value(0, i) for i in range(last.nfields)) if last.ntuples else None

    def _exchange(self, conn: Connection, send: Callable[[], int]) -> list[PGresult]:
        """``send`` requests in pipeline mode (it returns how many Syncs it sent), and wait
        for their results in `select.poll`: a signal's handler runs meanwhile (Ctrl-C
        interrupts the wait, as it does a cursor's), where the blocking
        ``PQexecPrepared`` would stay deaf for as long as the server is silent. The
        statements are then settled (`_settle`); the pool closes the connection when it
        comes back."""
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        try:
            syncs = send()
            return self._results(pgconn, syncs)
        except BaseException:
            self._settle(conn)
            if pgconn.pipeline_status != self._psycopg.pq.PipelineStatus.OFF:
                try:
                    pgconn.exit_pipeline_mode()
                except self._psycopg.OperationalError:  # results still due: unusable
                    conn.close()  # (the pool replaces a closed connection)
            raise

    def _results(self, pgconn: Any, syncs: int) -> list[PGresult]:
        """The results of the statements sent on ``pgconn`` before ``syncs`` Syncs, waited
        for in a poll; the connection leaves pipeline mode after the last."""
        pq = self._psycopg.pq
        poll = select.poll()
        poll.register(pgconn.socket, select.POLLIN | select.POLLOUT)
        while pgconn.flush():  # the requests did not fit into the socket at once
            poll.poll()
            pgconn.consume_input()  # what the server sent meanwhile, as libpq asks
        poll.modify(pgconn.socket, select.POLLIN)
        results: list[PGresult] = []
        while syncs:
            if pgconn.is_busy():  # read only when what came so far is used up
                poll.poll()
                pgconn.consume_input()
            elif (result := pgconn.get_result()) is None:  # between two statements' results
                if pgconn.status == pq.ConnStatus.BAD:
                    raise self._psycopg.OperationalError("the connection broke")
            elif result.status == pq.ExecStatus.PIPELINE_SYNC:
                syncs -= 1
            else:
                results.append(result)
        pgconn.exit_pipeline_mode()
        return results

    def _settle(self, conn: Connection) -> None:
        """Cancel the statement whose wait an exception cut short, and wait (`SETTLE`
        seconds at most) for it to end.

        The server goes on with a statement whose client stopped listening, and
        commits it. What the caller does next, on another connection, must come
        after that: a lock call interrupted by Ctrl-C gives its request back, and a
        grant committed after that give-back would stay held, by a request nobody
        knows of, until the session ends. Cancelled, a statement still running
        rolls back; one that has committed just answers. Past `SETTLE` the outcome
        stays unknown, as it is when the server cannot be reached. (psycopg's own
        ``Connection.wait`` does the same, 5 s too, but only for KeyboardInterrupt and
        SystemExit, not the command line's stop signals; and the prepared calls do not
        go through it: `_exchange`.)
        """
        pgconn = conn.pgconn
        # Not running (nothing sent, or all of it answered), or the connection is broken.
        if pgconn.transaction_status != self._psycopg.pq.TransactionStatus.ACTIVE:
            return
        deadline = time.monotonic() + SETTLE
        poll = select.poll()
        poll.register(pgconn.socket, select.POLLIN)
        try:
            conn.cancel_safe(timeout=SETTLE)
            while True:
                pgconn.consume_input()
                if not pgconn.is_busy():
                    if pgconn.get_result() is None:
                        with suppress(self._psycopg.OperationalError):  # results still due
                            pgconn.exit_pipeline_mode()
                            return
                elif (left := deadline - time.monotonic()) <= 0:
                    return
                else:
                    poll.poll(left * 1000)
        except Exception:  # the connection failed too: the caller's exception tells
            return

    def error(self, exc: BaseException) -> StoreError:
        """The `StoreError` for a driver's failure: the store and the cause, no secret.

        Raised ``from None``: the driver's exception, and its message, stay out of
        tracebacks and logs.
        """
        return StoreError(f"lock store {self.url.display}: {describe(self.url, exc)}")

    def close(self) -> None:
        with self._first_lock:
            first, self._first = self._first, None
        if first is not None:
            first.close()
        self._pool.close()  # `closed` from its first step: a call in flight drops the kept one
        self._drop_kept()


class _Overran(Exception):
    """A call's time ran out: its connection was shut down under it (`Connections._bounded`)."""


def _transient(exc: Exception, conn: Connection | None) -> bool:
    """Whether trying again on another connection may succeed.

    Not: bad credentials, bad SQL, a full disk — only what the table above names,
    or a connection that broke under the statement.
    """
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is not None and sqlstate.startswith(_TRANSIENT):
        return True
    if conn is not None:
        return bool(conn.closed or conn.broken)
    return sqlstate is None  # could not connect, and the server said nothing: refused, reset
