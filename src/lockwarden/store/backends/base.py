"""What a storage backend provides, and what the SQL backends share.

A backend knows how to reach its database and how to run the acquire and
release algorithm of the design note in one transaction; everything else the
store does is shared SQL (`queries`) run through the few primitives below.
The statements of `queries` are also the names of those operations: a
backend without SQL (`etcd`) maps each statement it is given to code of its own.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from lockwarden.store import process
from lockwarden.store.url import StoreURL
from lockwarden.store.wakeups import Wakeups

Row = dict[str, Any]
Params = Mapping[str, object]
Run = Callable[..., list[Row]]
"""Runs one shared statement inside a transaction: ``run(sql, params={}) -> rows``."""

Opening = Literal["create", "existing", "inspect"]
"""How a backend treats the store's tables when it opens (`Backend._migrate`)."""

T = TypeVar("T")
C = TypeVar("C")


STORE_LOG = "lockwarden.store"
"""The logger (`hooks.logger`) of what goes wrong out of sight: a heartbeat retried,
a close that failed, a notification listener reconnecting."""

TAG_LENGTH = 16
"""Hex digits at the end of a session id that name its store's wake-up route
(its inbox; on PostgreSQL its grant channel too): `SQLBackend.new_session_id`."""


def random_hex(nbytes: int) -> str:
    """``nbytes`` from the OS's CSPRNG in hex: the ids of sessions, requests and tags.

    The same bytes as `secrets.token_hex`, without importing `secrets`
    (which brings in `hmac` and `hashlib`: milliseconds at every start of
    the command line, for nothing it needs).
    """
    return os.urandom(nbytes).hex()


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


class FoughtOver:
    """The names a store has lately seen fought over: a hint for the backends that choose
    client-side between two ways of the same attempt or release (SQLite, MySQL, etcd).

    A name goes in when a release lets someone in or an attempt of it is
    blocked, and out when an attempt finds it free. Only a choice of the
    statements to send: never a question of who gets the lock. At most
    `KEPT` names are remembered; one more is only treated as calm.
    """

    KEPT = 1024

    def __init__(self) -> None:
        self._names: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def note(self, names: Sequence[str], fought: bool) -> None:
        """Remember whether ``names`` are fought over, as an acquire or a release just saw."""
        if not fought:
            self._names.difference_update(names)
        elif len(self._names) < self.KEPT:
            self._names.update(names)


class Pool(Generic[C]):
    """Idle connections kept for reuse; a new one is opened whenever none is idle.

    There is no upper bound: a connection is only held for one transaction,
    so the number open follows the number of threads talking to the store at
    once. A connection that failed is closed instead of returned.

    A pool belongs to the process that made it: in a process forked from it,
    every use raises `LockUsageError` (design note, "Processes: exit and fork").
    """

    def __init__(self, connect: Callable[[], C], close: Callable[[C], None], keep: int = 8):
        self._connect = connect
        self._close = close
        self._keep = keep
        self._idle: list[C] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def run(self, work: Callable[[C], T]) -> T:
        """``work`` on an idle connection (a new one if none is idle), kept for the next.

        A plain call, not a context manager: this runs twice per lock and release,
        and a ``@contextmanager`` makes a generator and its wrapper on every call.
        """
        if os.getpid() != self._pid:
            raise process.forked_from(self._pid)
        try:
            conn = self._idle.pop()  # atomic: no lock needed to take one
        except IndexError:
            conn = self._connect()
        try:
            result = work(conn)
        except BaseException:
            self._close(conn)
            raise
        with self._lock:  # against `close`, which empties the list once and for all
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(conn)
                return result
        self._close(conn)
        return result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            self._close(conn)


class AcquireRequest(NamedTuple):
    """One attempt of one request, as sent to the database (design note, "Acquire")."""

    session_id: str
    request_id: str
    """Chosen by the client and kept across attempts: a retry is recognised."""
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


class Attempt(NamedTuple):
    """What one attempt found, the same from every backend."""

    status: str
    """"granted", "blocked", "lost" (our session is not live) or "deadlock"."""
    tokens: Mapping[str, int] = MappingProxyType({})
    """The fencing token of each name (granted)."""
    reclaimed: bool = False
    """Rows of dead holders were removed on the way (granted or blocked)."""
    rows: tuple[Row, ...] | None = ()
    """What is in the way (blocked): `queries.IN_THE_WAY` rows; None if the attempt queued
    the request without reading them (`queries.BLOCKED_BY_LIVE`), at ``seq``."""
    edges: tuple[tuple[str, str], ...] = ()
    """The waits-for edges reachable from our session (deadlock)."""
    seq: int | None = None
    """The request's place in the queue (blocked, without rows)."""

    @classmethod
    def from_dict(cls, found: Mapping[str, Any]) -> Attempt:
        return cls(
            status=found["status"],
            tokens=dict(found.get("tokens") or {}),
            reclaimed=bool(found.get("reclaimed")),
            rows=None if "seq" in found else tuple(found.get("rows") or ()),
            edges=tuple((src, dst) for src, dst in found.get("edges") or ()),
            seq=found.get("seq"),
        )


class Backend(ABC):
    """One database holding one lock store."""

    relaxed: bool = False
    """Lock transactions commit without waiting for the disk (PostgreSQL and SQLite)."""

    pokes: bool = False
    """Releases of this machine may poke this store's waiters (`inbox`): a waiting thread
    then reads a mailbox of its own (`inbox.MailboxSubscription`)."""

    look_every: float | None = None
    """How often (seconds) a waiter asks whether it was granted though nothing woke it,
    where a wake-up this backend sends can be lost (None: none can; `waiting._wait`)."""

    def __init__(self, url: StoreURL) -> None:
        self.url = url
        self.stats = Stats()
        self.wakeups = Wakeups(self._watch)

    # -- what each backend provides -------------------------------------------------

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
        """Delete a request's holder rows and queue entries, and pass the names on.

        Returns how many holder rows were deleted. Also the abandon of a request
        that stops waiting: it deletes a grant made to it meanwhile too.

        Passing on (design note, "Release"): in the same transaction, under the
        names' locks, grant the requests the freed names now admit, in queue
        order (`queries.GRANT_CANDIDATES`, `WAITING_ITEMS`, `IN_THE_WAY`,
        `INSERT_HOLDERS`), then address each granted request with its tokens
        and each of `queries.HOLDING_WAITERS` with none — through every
        process's `Wakeups.address` (PostgreSQL: NOTIFY on the waiter's store's
        `plpgsql.grant_channel`; SQLite: directly in the releasing process,
        through the poller of every other).
        """

    @abstractmethod
    def _watch(self, timeout: float | None) -> None:
        """Start delivering wake-ups from other processes (called before the first wait),
        waiting at most ``timeout`` seconds (None: no limit) for them to be in force: the
        time the waiter has left: one whose time runs out first goes on, to time out."""

    @abstractmethod
    def close(self) -> None:
        """Stop background threads and close every connection."""

    def new_session_id(self) -> str:
        """A new session's id: 128 random bits (a backend may add what routes its wake-ups)."""
        return random_hex(16)
