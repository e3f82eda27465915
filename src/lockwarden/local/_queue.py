"""One resource's lock queue and the requests in it.

The grant rule lives here, once, for every kind of queue (see README.md,
"The grant rule"): a request is granted when no granted lock of another owner
and no request waiting ahead of it makes it wait. Subclasses change only
*where* a new request is placed (metadata locks) and *what* conflicts (range
locks, whose modes are not the five of `Mode`); the walk that grants waiters
is shared.

Everything here runs under the manager's mutex.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from time import monotonic as _monotonic
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

from lockwarden.modes import Mode

if TYPE_CHECKING:
    from lockwarden.local.manager import Txn

_X_BIT = Mode.X.bit


class LockMode(Protocol):
    """What a queue needs of a mode: `Mode`, and the range-lock modes of ``ranges.py``.

    ``conflicts`` is the mask of the modes that make a request for this one
    wait when another owner holds them (or waits for them ahead of it). For
    `Mode` the relation is symmetric; for range locks it is not (an insert
    waits for a gap lock, a gap lock never waits for an insert).
    """

    @property
    def index(self) -> int: ...
    @property
    def bit(self) -> int: ...
    @property
    def conflicts(self) -> int: ...
    @property
    def value(self) -> str: ...
    @property
    def parent_intention(self) -> Mode: ...
    def join(self, other: Self, /) -> Self: ...
    def covers(self, other: Self, /) -> bool: ...


M = TypeVar("M", bound=LockMode)


class Request(Generic[M]):
    """An owner's lock on one resource: granted, waiting, or granted and waiting to upgrade.

    An owner has at most one Request per queue (rule L3). A new request waits
    with ``mode is None``; an upgrade keeps its granted ``mode`` while it waits
    for ``wanted``, so the owner never holds less than it had.
    """

    __slots__ = (
        "children",
        "failure",
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
        owner: Txn,
        queue: Queue[M] | None,
        mode: M | None,
        wanted: M | None,
        parent: Request[Mode] | None = None,
    ) -> None:
        self.owner = owner
        self.queue = queue
        """None for a solo lock (the only request on its resource; see README)."""
        self.mode = mode
        self.wanted = wanted
        self.since = _monotonic()
        self.parent = parent
        """The owner's request on the parent resource (for a range lock: on the index's table),
        once this one is granted and counted in its `children`."""
        self.children = 0
        """Locks this owner holds on direct children of this resource, the keys of indexes
        on it included (unlock and escalation)."""
        # `failure`, `signal` and `wake` are set by `arm` when the request
        # starts to wait; nothing reads them before that.
        self.failure: BaseException | None
        """Set by another thread that refused this waiting request (deadlock victim)."""
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
    """Granted requests (by owner id) and waiting requests (in grant order) of one resource.

    ``counts[i]`` is how many owners hold the mode with index i, and ``mask``
    has the bit of every mode someone holds, so the arrival check against
    granted locks costs the same for one holder or ten thousand.
    """

    __slots__ = ("counts", "granted", "key", "mask", "waiting")

    kind = "data"
    """Which lock table and which books of a txn the queue belongs to: data, metadata, range."""
    width = 5
    """How many modes there are (the length of `counts`)."""

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.granted: dict[int, Request[M]] = {}
        self.waiting: list[Request[M]] = []
        self.counts = [0] * self.width
        self.mask = 0

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

        An upgrade goes ahead of every ordinary waiter (rule L5) because its
        owner already holds the resource: making it queue behind requests that
        wait for that very owner would be a deadlock of the queue's own making.
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
        self.waiting.insert(self.position_for(req, mode), req)
        req.wanted = mode
        req.since = time.monotonic()

    # -- granting and releasing ---------------------------------------------

    def add_granted(self, req: Request[M], mode: M) -> None:
        """Make `req` hold `mode` and wait for nothing (a grant, an upgrade, a downgrade)."""
        self.set_granted(req, mode)
        req.wanted = None
        req.since = time.monotonic()

    def remove_granted(self, req: Request[M]) -> None:
        assert req.mode is not None
        self.set_granted(req, None)

    def set_granted(self, req: Request[M], mode: M | None) -> None:
        """Make `req` hold `mode` (None: nothing), leaving whatever it waits for as it is."""
        old = req.mode
        counts = self.counts
        if old is not None:
            counts[old.index] -= 1
            if not counts[old.index]:
                self.mask &= ~old.bit
            if mode is None:
                del self.granted[req.owner.id]
        elif mode is not None:
            self.granted[req.owner.id] = req
        if mode is not None:
            counts[mode.index] += 1
            self.mask |= mode.bit
        req.mode = mode

    def remove_waiting(self, req: Request[M]) -> None:
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
                granted.append((req, req.since))
                self.add_granted(req, mode)
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

    @property
    def idle(self) -> bool:
        return not self.granted and not self.waiting


class MetadataQueue(Queue[Mode]):
    """A table's metadata lock: S for statements that use the table, X for DDL (rule L8).

    Exclusive requests go ahead of waiting shared ones, so a DDL statement is
    not starved by a stream of short queries. To keep the queries from being
    starved in turn, after `streak_limit` exclusive grants in a row while
    shared requests waited, the shared requests move ahead and new exclusive
    requests queue behind them until a shared request has been granted.
    """

    __slots__ = ("streak", "streak_limit")

    kind = "metadata"

    def __init__(self, key: Hashable, streak_limit: int) -> None:
        super().__init__(key)
        self.streak = 0
        self.streak_limit = streak_limit

    @property
    def parent_key(self) -> None:
        """A metadata lock is nobody's child, whatever its table's name looks like."""
        return None

    def position_for(self, req: Request[Mode], mode: Mode) -> int:
        pos = super().position_for(req, mode)
        if mode is not Mode.X or req.mode is not None or self.streak >= self.streak_limit:
            return pos
        for i, w in enumerate(self.waiting):
            if w.mode is None and w.wanted is Mode.S:
                return i
        return pos

    def granted_one(self, req: Request[Mode]) -> None:
        if req.mode is Mode.S:
            self.streak = 0
            return
        if any(w.wanted is Mode.S for w in self.waiting):
            self.streak += 1
            if self.streak >= self.streak_limit:
                # Serve the waiting shared requests first: upgrades stay in
                # front, then shared, then exclusive, each in arrival order.
                self.waiting.sort(key=_shared_first)


def _shared_first(w: Request[Mode]) -> int:
    return 0 if w.mode is not None else 1 if w.wanted is Mode.S else 2
