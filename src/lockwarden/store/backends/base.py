"""The seam between the store and its backends: what a backend provides.

A backend knows how to reach its database and how to run the acquire and
release algorithm of the design note in one transaction, and every other
operation the store needs (sessions, listings, administrators' overrides,
fences) is a named method of `Backend` with typed arguments. The SQL backends
implement them once, with the shared statements (`sql.base.SQLBackend`); etcd
with transactions of its own. No backend sees another's statements.
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
    #
    # The seam: named operations, each one transaction of the store (or a read). The
    # SQL backends run the shared statements of `sql.queries` for them
    # (`sql.base.SQLBackend`); etcd runs transactions of its own. Rows are dicts with
    # the columns the docstring names. An operation that may let waiters in (a
    # session closed or expired, locks broken or released, permits changed) wakes the
    # waiters of every name it frees, here and in other processes.

    @abstractmethod
    def open_session(
        self, *, session: str, app_id: str, host: str, pid: int, pid_start: str | None, ttl: float
    ) -> Row:
        """Record a live session. Row: ``started`` (what the session compares at each
        heartbeat to notice a server that restarted; constant where nothing restarts)."""

    @abstractmethod
    def heartbeat(self, session: str) -> list[Row]:
        """Move the session's lease on. No row: the session is not live any more. Row:
        ``started`` (as `open_session`)."""

    @abstractmethod
    def check(self, session: str, request: str, names: Sequence[str]) -> Row:
        """Whether the request still holds ``names``. Row: ``held`` (how many of them),
        ``live`` (the session is live)."""

    @abstractmethod
    def close_session(self, session: str) -> None:
        """End the session and free what it held and queued for (waking the next)."""

    @abstractmethod
    def expire_session(self, session: str) -> None:
        """Mark the session expired (its process is gone, or it learned it was lost),
        freeing what it held and queued for."""

    @abstractmethod
    def locks(self, name: str | None) -> list[Row]:
        """The holders (of ``name``, or of every name). Rows: ``name``, ``mode``,
        ``token``, ``stale`` and the holder's columns (`status.holder_of`)."""

    @abstractmethod
    def waiters(self, name: str | None) -> list[Row]:
        """The queued requests (of ``name``, or of every name), in queue order. Rows: the
        fields of `status.WaiterEntry`."""

    @abstractmethod
    def sessions(self) -> list[Row]:
        """Every session, live or not yet cleaned away. Rows: the fields of
        `status.SessionEntry`."""

    @abstractmethod
    def waits_for(self) -> list[Row]:
        """The waits-for graph between sessions. Rows: ``src``, ``dst``, ``name``."""

    @abstractmethod
    def permits(self, name: str) -> list[Row]:
        """The name's permits, if set. Row: ``read_permits``, ``write_permits``."""

    @abstractmethod
    def set_permits(self, name: str, read: int | None, write: int) -> None:
        """Set the name's permits (``(None, 1)``: back to the default), waking its waiters."""

    @abstractmethod
    def release_app(self, app_id: str, force: bool) -> int:
        """Expire the app's dead sessions (``force``: its live ones too) and release their
        locks; how many holders were removed."""

    @abstractmethod
    def break_lock(self, name: str) -> int:
        """Remove every holder of ``name``; how many there were."""

    @abstractmethod
    def clean(self) -> tuple[int, int, int]:
        """Remove expired sessions with their locks and queue entries, and queue entries
        past their deadline: how many (sessions, locks, waiters)."""

    @abstractmethod
    def record_admin(
        self, *, id: str, action: str, subject: str, detail: str, host: str, pid: int
    ) -> None:
        """Keep an administrator's override in the store (`admin_log`)."""

    @abstractmethod
    def admin_log(self, limit: int) -> list[Row]:
        """The latest overrides, newest first. Rows: ``action``, ``subject``, ``detail``,
        ``host``, ``pid``, ``at`` and ``now`` (the store's clock)."""

    @abstractmethod
    def admin_counts(self) -> dict[str, int]:
        """How many overrides of each action the store has kept."""

    @abstractmethod
    def reclaimed(self) -> int:
        """How many dead holders' locks were reclaimed by later acquirers."""

    @abstractmethod
    def fence_read(self, resource: str) -> list[Row]:
        """The fence's state, if it was ever used. Row: ``token`` (the highest admitted),
        ``written`` (the token of the last write), ``value``."""

    @abstractmethod
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
        """Admit ``token`` (and, with ``write``, store ``value``) if no higher token was
        admitted (no higher write, for a read) and, given ``session`` and ``request``,
        their grant still holds. Row: ``value`` (the value now); none: refused."""

    @abstractmethod
    def fence_reset(self, resource: str) -> int:
        """Forget the fence; the highest token it had admitted (0: none)."""

    def granted(self, request: str, session: str, names: Sequence[str]) -> list[Row]:
        """The grants a release made to a waiting request. Rows: ``name``, ``token``.

        Only a backend that sets `look_every` (whose wake-ups can be lost) is asked."""
        raise NotImplementedError(f"{type(self).__name__} sets look_every without granted")

    def in_the_way(
        self, request: str, name: str, mode: str, seq: int | None, refuse: bool
    ) -> list[Row]:
        """What is in the way of a queued request's ``name``, as a blocked attempt
        reports it (`Attempt.rows`). Only a backend whose attempts queue without
        looking (`Attempt` with ``rows=None``) is asked."""
        raise NotImplementedError(f"{type(self).__name__} queues without looking")

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
