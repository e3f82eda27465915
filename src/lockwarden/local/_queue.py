"""One resource's queue, the requests in it, and the grant rule, behind a small owner protocol.

The grant rule lives here, once, for every kind of queue (README.md, "The
grant rule"): a request is granted when no granted lock of another owner and
no request waiting ahead of it makes it wait. Subclasses change only *where*
a new request is placed (``_metadata.py``) and *what* conflicts
(``_range_queue.py``, whose modes are not the five of `Mode`); the walk that
grants waiters is shared.

A queue sees an owner only through `Owner`, which is also all that the lock
table, the deadlock search, escalation and range locks may use of one. That
narrow interface is what lets them live in modules of their own below the
transaction (``_txn.py``), without importing it or reading its privates.

Everything here runs under the manager's mutex.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from time import monotonic
from typing import Any, Generic, Protocol, TypeVar

from lockwarden.local._kinds import LockMode, Table
from lockwarden.modes import Mode

_X_BIT = Mode.X.bit

M = TypeVar("M", bound=LockMode)


class Owner(Protocol):
    """What every module below the transaction knows of an owner of locks.

    `Txn` is the one implementation. Its attributes named here are private to
    the package, not to one module: this is the whole of what may be read or
    written from outside the transaction.
    """

    @property
    def id(self) -> int:
        """Unique per manager; ids grow in `begin` order (the youngest has the highest)."""
        ...

    _waiting: Request[Any] | None
    """The one request the owner waits for (one thread of control), or None while it runs."""
    _undo: dict[Request[Any], Any] | None
    """The undo of the owner's lock call in progress, if any: each request the call changed →
    what it held before. Index changes that move a request rewrite its entry (``_ranges.py``)."""
    _escalate_at: dict[int, int]
    """Child count at which escalation is tried again, by id of the parent request."""
    _waits_for: tuple[Owner, ...] | None
    """The owners its waiting request waits for, as the deadlock search last read them (last
    in queue first), or None. Meaningful only while the owner waits: a wait starts with None,
    and every change to the queue it waits in sets it back to None (`Queue.forget_edges`)."""
    _waits_mark: object
    """The deadlock search that last visited the owner (each search is a new object). A mark
    on the owner, next to the two attributes the search reads, where a set of visited owners
    would be one more place in memory to reach per node."""

    def _books(self, table: Table) -> dict[Any, Request[Any]]:
        """The owner's requests in `table`, by key: at most one per key."""
        ...

    def _count(self) -> int:
        """How many requests the owner has in all tables (a victim policy reads it)."""
        ...


class Request(Generic[M]):
    """An owner's lock on one resource: granted, waiting, or granted and waiting to upgrade.

    An owner has at most one Request per resource. A new request waits with
    ``mode is None``; an upgrade keeps its granted ``mode`` while it waits
    for ``wanted``, so the owner never holds less than it had.
    """

    __slots__ = (
        "children",
        "failure",
        "grant",
        "mode",
        "owner",
        "parent",
        "queue",
        "signal",
        "since",
        "wake",
        "wanted",
    )

    def __init__(
        self,
        owner: Owner,
        queue: Queue[M] | None,
        mode: M | None,
        wanted: M | None,
        parent: Request[Mode] | None = None,
        *,
        stamped: bool = True,
    ) -> None:
        self.owner = owner
        self.queue = queue
        """None for a solo lock (the only request on its resource; README.md, "Solo locks")."""
        self.mode = mode
        self.wanted = wanted
        self.since: float | None = monotonic() if stamped else None
        """``time.monotonic()`` when it was granted or started to wait. None for a lock granted on
        the uncontended path, which reads no clock: stamped when first seen (`LockManager.locks`,
        or a second request on its resource)."""
        self.parent = parent
        """The owner's request on the parent resource (for a range lock: on the index's table),
        once this one is granted and counted in its `children`."""
        self.children = 0
        """Locks this owner holds on direct children of this resource, the keys of indexes
        on it included (unlock and escalation)."""
        # `failure`, `signal` and `wake` are set by `arm` when the request
        # starts to wait, `grant` when a wait is granted; nothing reads them before that.
        self.failure: BaseException | None
        """Set by another thread that refused this waiting request (deadlock victim)."""
        self.grant: M
        """The mode its last wait was granted, kept for the call that waited: until that call's
        thread comes back, an index change may merge or drop the request (``_ranges.py``)."""
        self.signal: Any
        """What the waiting thread or task blocks on; `wake` releases it."""
        self.wake: Callable[[], object]

    @property
    def in_queue(self) -> Queue[M]:
        """The queue of a request known not to be solo (waiting, or made by the general path)."""
        assert self.queue is not None, "a solo lock has no queue"
        return self.queue

    def arm(self, signal: Any, wake: Callable[[], object]) -> None:
        self.failure = None
        self.signal = signal
        self.wake = wake


class Queue(Generic[M]):
    """Granted requests (by owner) and waiting requests (in grant order) of one resource.

    ``counts[i]`` is how many owners hold the mode with index i, and ``mask``
    has the bit of every mode someone holds, so the arrival check against
    granted locks costs the same for one holder or ten thousand.

    The deadlock search keeps the edges it reads from a small queue on the
    waiters' owners (`Owner._waits_for`) and sets `edges_kept`; every change to
    who holds what or who waits where then clears them all
    (`forget_edges`), so kept edges are never stale.
    """

    __slots__ = ("counts", "edges_kept", "granted", "key", "mask", "waiting")

    table = Table.DATA
    """Which lock table, and which books of an owner, the queue belongs to."""
    width = 5
    """How many modes there are (the length of `counts`)."""

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.granted: dict[Owner, Request[M]] = {}
        """By owner: when every mode held makes a request wait, its holders are the keys, and
        the deadlock search reads no request to find them."""
        self.waiting: list[Request[M]] = []
        self.counts = [0] * self.width
        self.mask = 0
        self.edges_kept = False

    @property
    def resource(self) -> Hashable:
        """The locked thing as messages and snapshots show it."""
        return self.key

    @property
    def parent_key(self) -> Hashable | None:
        """The resource whose request counts this queue's granted locks among its `children`."""
        key = self.key
        return key[:-1] if type(key) is tuple and len(key) > 1 else None

    # -- conflicts ---------------------------------------------------------

    def _mask_of_others(self, req: Request[M]) -> int:
        """Bits of the modes granted to owners other than req's."""
        own = req.mode
        if own is not None and self.counts[own.index] == 1:
            return self.mask & ~own.bit
        return self.mask

    def blocked_by_granted(self, req: Request[M], mode: M) -> bool:
        return bool(mode.conflicts & self._mask_of_others(req))

    def blocks(self, held: M, wanted: M) -> bool:
        """Whether a lock in `held` (granted or ahead) of another owner makes `wanted` wait."""
        return bool(wanted.conflicts & held.bit)

    # -- placement -----------------------------------------------------------

    def position_for(self, req: Request[M], mode: M) -> int:
        """Where a waiting request for `mode` goes: upgrades after earlier upgrades, others last.

        An upgrade goes ahead of every ordinary waiter because its owner
        already holds the resource: making it queue behind requests that wait
        for that very owner would be a deadlock of the queue's own making.
        """
        if req.mode is None:
            return len(self.waiting)
        pos = 0
        for w in self.waiting:
            if w.mode is None:
                break
            pos += 1
        return pos

    def blocked_on_arrival(self, req: Request[M], mode: M) -> bool:
        """The grant rule for a request that is not queued yet."""
        if self.blocked_by_granted(req, mode):
            return True
        waiting = self.waiting
        if not waiting:
            return False
        for ahead in waiting[: self.position_for(req, mode)]:
            if self.blocks(ahead.wanted, mode):  # type: ignore[arg-type]
                return True
        return False

    def enqueue(self, req: Request[M], mode: M) -> None:
        if self.edges_kept:
            self.forget_edges()
        self.waiting.insert(self.position_for(req, mode), req)
        req.wanted = mode
        req.since = monotonic()
        req.owner._waits_for = None  # a wait starts with no edges read

    def append_waiting(self, req: Request[M], mode: M) -> None:
        """Queue `req` for `mode` behind every waiter, keeping its `since` (a moved request)."""
        if self.edges_kept:
            self.forget_edges()
        self.waiting.append(req)
        req.wanted = mode
        req.owner._waits_for = None

    def set_wanted(self, req: Request[M], mode: M) -> None:
        """Change what a waiting request waits for, in place (a moved request joins another)."""
        if self.edges_kept:
            self.forget_edges()
        req.wanted = mode

    def forget_edges(self) -> None:
        """The queue is about to change: the edges kept from it are stale from now on."""
        self.edges_kept = False
        for w in self.waiting:
            w.owner._waits_for = None

    # -- granting and releasing ---------------------------------------------

    def add_granted(self, req: Request[M], mode: M) -> None:
        """Make `req` hold `mode` and wait for nothing (a grant, an upgrade, a downgrade)."""
        self.set_granted(req, mode)
        req.wanted = None
        req.since = monotonic()

    def remove_granted(self, req: Request[M]) -> None:
        assert req.mode is not None
        self.set_granted(req, None)

    def set_granted(self, req: Request[M], mode: M | None) -> None:
        """Make `req` hold `mode` (None: nothing), leaving whatever it waits for as it is."""
        if self.edges_kept:
            self.forget_edges()
        old = req.mode
        counts = self.counts
        if old is not None:
            counts[old.index] -= 1
            if not counts[old.index]:
                self.mask &= ~old.bit
            if mode is None:
                del self.granted[req.owner]
        elif mode is not None:
            self.granted[req.owner] = req
        if mode is not None:
            counts[mode.index] += 1
            self.mask |= mode.bit
        req.mode = mode

    def remove_waiting(self, req: Request[M]) -> None:
        if self.edges_kept:
            self.forget_edges()
        self.waiting.remove(req)
        req.wanted = None

    def grant_waiters(self) -> list[tuple[Request[M], float]]:
        """Grant, in queue order, every waiter that the grant rule allows now.

        A waiter passes if it is compatible with the granted locks of others
        and with every request still waiting ahead of it, so nothing is ever
        granted past a waiter it conflicts with (no barging). The walk keeps
        a summary of the waiters it passed over (`_ahead_*`: a mask of modes
        here; what conflicts is the only thing a subclass changes) and stops
        once nothing behind them could pass. The granted requests are
        returned, each with the time it started waiting (a grant resets
        `since`); the caller wakes them.
        """
        granted: list[tuple[Request[M], float]] = []
        ahead = self._ahead_start()
        waiting = self.waiting
        i = 0
        while i < len(waiting):
            req = waiting[i]
            mode = req.wanted
            assert mode is not None
            if not self._ahead_blocks(ahead, mode) and not self.blocked_by_granted(req, mode):
                del waiting[i]
                since = req.since
                assert since is not None  # stamped when it started to wait
                granted.append((req, since))
                self.add_granted(req, mode)
                req.grant = mode
                self.granted_one(req)
                continue
            ahead = self._ahead_add(ahead, mode)
            if self._ahead_blocks_all(ahead):
                break
            i += 1
        return granted

    # The summary of waiters passed over by the walk: a mask of their modes.

    def _ahead_start(self) -> Any:
        return 0

    def _ahead_add(self, ahead: Any, mode: M) -> Any:
        return ahead | mode.bit

    def _ahead_blocks(self, ahead: Any, mode: M) -> bool:
        return bool(mode.conflicts & ahead)

    def _ahead_blocks_all(self, ahead: Any) -> bool:
        return bool(ahead & _X_BIT)  # X waits ahead: nothing is compatible with it

    def granted_one(self, req: Request[M]) -> None:
        """Hook run at each grant: metadata locks keep their history, a range lock can insert."""

    # -- introspection -------------------------------------------------------

    def blockers(self, req: Request[M]) -> Iterator[Request[M]]:
        """The requests of other owners that `req` (waiting) waits for: its waits-for edges."""
        mode = req.wanted
        assert mode is not None
        owner = req.owner
        for held in self.granted.values():
            if held.owner is not owner and self.blocks(held.mode, mode):  # type: ignore[arg-type]
                yield held
        for ahead in self.waiting:
            if ahead is req:
                return
            if ahead.owner is not owner and self.blocks(ahead.wanted, mode):  # type: ignore[arg-type]
                yield ahead

    def would_block(self, req: Request[M], mode: M) -> Iterator[Request[M]]:
        """The requests of other owners a request for `mode` not queued yet would wait for."""
        owner = req.owner
        for held in self.granted.values():
            if held.owner is not owner and self.blocks(held.mode, mode):  # type: ignore[arg-type]
                yield held
        for ahead in self.waiting[: self.position_for(req, mode)]:
            if ahead.owner is not owner and self.blocks(ahead.wanted, mode):  # type: ignore[arg-type]
                yield ahead
