"""What a storage backend provides, and what both backends share.

A backend knows how to reach its database and how to run the acquire and
release algorithm of the design note in one transaction; everything else the
store does is shared SQL (`queries`) run through the few primitives below.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from lockwarden.store import schema
from lockwarden.store.queries import Dialect
from lockwarden.store.url import StoreURL
from lockwarden.store.wakeups import Wakeups

Row = dict[str, Any]
Params = Mapping[str, object]
Run = Callable[..., list[Row]]
"""Runs one shared statement inside a transaction: ``run(sql, params={}) -> rows``."""

T = TypeVar("T")
C = TypeVar("C")


class Stats:
    """Counters a test or a benchmark can read: statements sent, attempts made.

    Each statement is one round trip on PostgreSQL (no pipelining), so the
    ``statements`` counter is also the round-trip count.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def __getitem__(self, key: str) -> int:
        with self._lock:
            return self._counts.get(key, 0)


class Pool(Generic[C]):
    """Idle connections kept for reuse; a new one is opened whenever none is idle.

    There is no upper bound: a connection is only held for one transaction,
    so the number open follows the number of threads talking to the store at
    once. A connection that failed is closed instead of returned.
    """

    def __init__(self, connect: Callable[[], C], close: Callable[[C], None], keep: int = 8):
        self._connect = connect
        self._close = close
        self._keep = keep
        self._idle: list[C] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[C]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        except BaseException:
            self._close(conn)
            raise
        with self._lock:
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(conn)
                return
        self._close(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            self._close(conn)


@dataclass(frozen=True)
class AcquireRequest:
    """One attempt of one request, as sent to the database (design note, "Acquire")."""

    session_id: str
    request_id: str
    """Chosen by the client and kept across attempts: a retry is recognised (D5)."""
    names: tuple[str, ...]
    modes: tuple[str, ...]
    """"S" or "X", one per name."""
    enqueue: bool
    """Take a place in the queues if the request must wait (False: a try)."""
    refuse: bool
    """Never take over a dead holder's lock (on_stale="refuse")."""
    wait: float | None
    """Seconds the caller is still prepared to wait (None: forever): the queue
    entries expire then, even if the caller vanishes without removing them."""
    queued: bool = False
    """An earlier attempt queued this request, so it is most likely still blocked
    (SQLite then looks before it queues for the write lock)."""


@dataclass(frozen=True)
class Attempt:
    """What one attempt found, identical from both backends."""

    status: str
    """"granted", "blocked", "lost" (our session is not live) or "deadlock"."""
    tokens: Mapping[str, int] = field(default_factory=dict)
    """The fencing token of each name (granted)."""
    reclaimed: bool = False
    """Rows of dead holders were removed on the way (granted or blocked)."""
    rows: tuple[Row, ...] = ()
    """What is in the way (blocked): `queries.IN_THE_WAY` rows."""
    edges: tuple[tuple[str, str], ...] = ()
    """The waits-for edges reachable from our session (deadlock)."""

    @classmethod
    def from_dict(cls, found: Mapping[str, Any]) -> Attempt:
        return cls(
            status=found["status"],
            tokens=dict(found.get("tokens") or {}),
            reclaimed=bool(found.get("reclaimed")),
            rows=tuple(found.get("rows") or ()),
            edges=tuple((src, dst) for src, dst in found.get("edges") or ()),
        )


class Backend(ABC):
    """One database holding one lock store."""

    dialect: Dialect
    relaxed: bool = False
    """Lock transactions commit without waiting for the disk (PostgreSQL only)."""

    def __init__(self, url: StoreURL) -> None:
        self.url = url
        self.stats = Stats()
        self.wakeups = Wakeups(self._watch)

    # -- what each backend provides -------------------------------------------------

    @abstractmethod
    def _in_transaction(self, work: Callable[[Run], T]) -> T:
        """Run ``work`` in one transaction, alone: SQLite's ``BEGIN IMMEDIATE`` excludes
        every other writer; on PostgreSQL (where only migrations need this) an advisory
        lock excludes other migrations."""

    @abstractmethod
    def query(self, sql: str, params: Params | None = None, *, write: bool = False) -> list[Row]:
        """Run one shared statement on its own (in its own transaction if it writes)."""

    @abstractmethod
    def change(self, statements: Sequence[str], params: Params) -> list[list[str | None]]:
        """Run statements that may let waiters in, atomically, and wake the waiters
        of every name they return. Returns each statement's ``name`` column."""

    @abstractmethod
    def acquire(self, request: AcquireRequest) -> Attempt:
        """One attempt of the acquire algorithm, in one transaction."""

    @abstractmethod
    def release(self, session_id: str, request_id: str, names: Sequence[str]) -> int:
        """Delete a request's holder rows and queue entries; wake waiters of ``names``.

        Returns how many holder rows were deleted.
        """

    @abstractmethod
    def _watch(self) -> None:
        """Start delivering wake-ups from other processes (called before the first wait)."""

    @abstractmethod
    def close(self) -> None:
        """Stop background threads and close every connection."""

    # -- shared ---------------------------------------------------------------------

    def _migrate(
        self, bootstrap: Sequence[str], backend_steps: Mapping[int, Sequence[str]]
    ) -> None:
        """Create or upgrade the store's tables, one process at a time."""

        def work(run: Run) -> None:
            for statement in (*bootstrap, schema.BOOTSTRAP):
                run(statement)
            rows = run(schema.READ_VERSION)
            for version in schema.pending(rows[0]["value"] if rows else None, self.url.display):
                for statement in schema.steps(version, backend_steps):
                    run(statement)
                run(schema.WRITE_VERSION, {"version": version})

        self._in_transaction(work)
