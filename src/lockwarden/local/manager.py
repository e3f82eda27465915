"""The in-process lock manager: a database engine's lock table for threads and asyncio tasks.

See README.md in this package for the invariants and why they hold; the
comments here point back to its sections and to the rule ids (L1…L12) of
DESIGN.md.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from lockwarden.errors import Deadlock, LockTimeout, LockUsageError
from lockwarden.local._deadlock import find_cycle
from lockwarden.local._queue import MetadataQueue, Queue, Request
from lockwarden.local.ranges import (
    SUPREMUM,
    Index,
    Inserting,
    Kind,
    RangeMode,
    RangeQueue,
    Step,
    insert_steps,
    scan_steps,
)
from lockwarden.modes import Mode

__all__ = ["LockInfo", "LockManager", "LockStats", "Txn"]

Resource = tuple[Hashable, ...]
Victim = Literal["requester", "youngest", "fewest_locks"]
T = TypeVar("T")

_VICTIMS = ("requester", "youngest", "fewest_locks")
_INTENTIONS = frozenset((Mode.IS, Mode.IX))
_ROW_MODES = frozenset((Mode.S, Mode.X))
# Parent modes under which a child lock needs nothing more on the parent and
# is not already implied by it: IS or IX under a reader, IX under a writer.
_FAST_PARENTS = {
    mode: frozenset((Mode.IS, Mode.IX) if mode.parent_intention is Mode.IS else (Mode.IX,))
    for mode in Mode
}


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One entry of `LockManager.locks()`: a granted lock or a waiting request."""

    resource: Resource
    """For a range lock, ``(index name, key)``."""
    owner: int
    """The owning transaction's id."""
    mode: Mode | RangeMode
    granted: bool
    since: float
    """``time.monotonic()`` when it was granted, or when it started waiting."""
    kind: str = "data"
    """"data" for resource locks, "metadata" for a table's metadata lock, "range" for a key."""


@dataclass(frozen=True, slots=True)
class LockStats:
    """Counters since the manager was created (rule L11)."""

    grants: int
    waits: int
    """Requests that could not be granted at once and queued (failed tries excluded)."""
    timeouts: int
    deadlocks: int
    escalations: int
    wait_time: float
    """Total seconds spent queued, however the waits ended."""


class LockManager:
    """A lock table with intention modes, FIFO queues, upgrades, timeouts and deadlock detection.

    Resources are tuples naming a path in a hierarchy whose levels are
    `levels` (by default a table and its rows: ``("orders",)`` and
    ``("orders", 42)``). Locks are held by transactions from `begin`.

    Timeouts (seconds) come in two classes, as in the AntDB-M engine: row and
    intention locks wait `wait_timeout` by default and at most
    `max_wait_timeout`; locks that cover a whole table or more (S, SIX, X above
    the last level) and exclusive metadata locks wait `ddl_wait_timeout`, at
    most `max_ddl_wait_timeout`. A maximum of None means unbounded.
    """

    # Slots, not an instance dict: CPython keeps the attributes of a plain
    # instance in a shared-key dict only up to about 30 of them, and past
    # that every attribute read on the uncontended path gets slower (3% of
    # a row lock + unlock, measured when the range tables were added).
    __slots__ = (
        "_acquire",
        "_critical",
        "_deadlocks",
        "_depth",
        "_escalation_floor",
        "_escalations",
        "_grants",
        "_indexes",
        "_meta_queues",
        "_mutex",
        "_next_id",
        "_queues",
        "_range_queues",
        "_release",
        "_tables",
        "_timeouts",
        "_wait_time",
        "_waits",
        "_wakes",
        "ddl_wait_timeout",
        "deadlock_max_depth",
        "deadlock_max_steps",
        "escalation_retry",
        "escalation_threshold",
        "levels",
        "max_ddl_wait_timeout",
        "max_wait_timeout",
        "metadata_exclusive_streak",
        "metadata_locks",
        "strict",
        "victim",
        "wait_timeout",
    )

    def __init__(
        self,
        levels: tuple[str, ...] = ("table", "row"),
        *,
        strict: bool = False,
        wait_timeout: float = 0.05,
        max_wait_timeout: float | None = 0.6,
        ddl_wait_timeout: float = 1.8,
        max_ddl_wait_timeout: float | None = 7.2,
        victim: Victim = "requester",
        deadlock_max_steps: int = 1_000_000,
        deadlock_max_depth: int = 200,
        escalation_threshold: int | None = 5000,
        escalation_retry: int = 1250,
        metadata_locks: bool = False,
        metadata_exclusive_streak: int = 4,
    ) -> None:
        if (
            not isinstance(levels, tuple)
            or not levels
            or not all(isinstance(level, str) and level for level in levels)
        ):
            raise LockUsageError(f"levels must be a non-empty tuple of level names, got {levels!r}")
        if victim not in _VICTIMS:
            raise LockUsageError(f"victim must be one of {', '.join(_VICTIMS)}; got {victim!r}")
        for name, value in (
            ("deadlock_max_steps", deadlock_max_steps),
            ("deadlock_max_depth", deadlock_max_depth),
            ("escalation_retry", escalation_retry),
            ("metadata_exclusive_streak", metadata_exclusive_streak),
        ):
            _check_positive_int(name, value)
        if escalation_threshold is not None:
            _check_positive_int("escalation_threshold", escalation_threshold)
        for default, maximum, name in (
            (wait_timeout, max_wait_timeout, "wait_timeout"),
            (ddl_wait_timeout, max_ddl_wait_timeout, "ddl_wait_timeout"),
        ):
            _check_seconds(name, default)
            if maximum is not None:
                _check_seconds("max_" + name, maximum)
                if default > maximum:
                    raise LockUsageError(f"{name}={default} is above max_{name}={maximum}")

        self.levels = levels
        self.strict = strict
        self.wait_timeout = wait_timeout
        self.max_wait_timeout = max_wait_timeout
        self.ddl_wait_timeout = ddl_wait_timeout
        self.max_ddl_wait_timeout = max_ddl_wait_timeout
        self.victim: Victim = victim
        self.deadlock_max_steps = deadlock_max_steps
        self.deadlock_max_depth = deadlock_max_depth
        self.escalation_threshold = escalation_threshold
        self.escalation_retry = escalation_retry
        self.metadata_locks = metadata_locks
        self.metadata_exclusive_streak = metadata_exclusive_streak

        self._depth = len(levels)
        self._escalation_floor = math.inf if escalation_threshold is None else escalation_threshold
        self._mutex = threading.Lock()
        self._queues: dict[Hashable, Queue[Mode] | Request[Mode]] = {}
        """The lock table. A resource is here only while something is granted or waiting
        (rule L4): as its `Queue`, or, while one owner holds it and nobody else has
        asked, as that owner's `Request` alone (a solo lock; README, "Solo locks")."""
        self._acquire = self._mutex.acquire
        self._release = self._mutex.release
        self._wakes: list[Request[Any]] = []
        """Waiters granted or refused under the mutex, to wake once it is released (`_leave`)."""
        self._critical = _Critical(self)
        self._meta_queues: dict[Hashable, Queue[Mode]] = {}
        self._range_queues: dict[tuple[Index, Hashable], RangeQueue] = {}
        """The lock table of index keys, by (index, key); always queues, never solo locks."""
        self._tables: dict[str, dict[Any, Any]] = {
            "data": self._queues,
            "metadata": self._meta_queues,
            "range": self._range_queues,
        }
        """Each lock table by the `kind` of its queues."""
        self._indexes: dict[str, Index] = {}
        self._next_id = itertools.count(1).__next__
        # Counters (rule L11), plain attributes: the uncontended path bumps one.
        self._grants = self._waits = self._timeouts = self._deadlocks = self._escalations = 0
        self._wait_time = 0.0

    def begin(self, name: str | None = None) -> Txn:
        """A new owner of locks. Ids grow in `begin` order, so the youngest has the highest."""
        return Txn(self, self._next_id(), name)

    def index(self, name: str, *, table: Resource | None = None, keys: Iterable[Any] = ()) -> Index:
        """The ordered index called `name`, made on first use with `table` and `keys` (part R).

        Range locks on its keys first take the intention lock they need on
        `table` (IS to read, IX to write or insert), like a row lock on its
        table; without a table they stand alone. Later calls return the same
        index and may not pass a different table or any keys.
        """
        if not isinstance(name, str) or not name:
            raise LockUsageError(f"an index name is a non-empty string, got {name!r}")
        if table is not None:
            _check_resource(self, table, Mode.IX)
        with self._mutex:
            index = self._indexes.get(name)
            if index is None:
                index = self._indexes[name] = Index(self, name, table, keys)
            elif (table is not None and table != index.table) or keys != ():
                raise LockUsageError(
                    f"index {name!r} exists (table {index.table!r}); call mgr.index({name!r}) "
                    f"without a table or keys to get it, or choose another name"
                )
            return index

    # -- introspection (rule L11) --------------------------------------------------

    def locks(self) -> list[LockInfo]:
        """A consistent snapshot of every granted lock and waiting request."""
        out: list[LockInfo] = []
        with self._mutex:
            for key, entry in self._all_entries():
                if isinstance(entry, Request):  # a solo lock
                    assert entry.mode is not None
                    out.append(LockInfo(key, entry.owner.id, entry.mode, True, entry.since))
                    continue
                resource = entry.resource
                resource = resource if type(resource) is tuple else (resource,)
                kind = entry.kind
                for req in entry.granted.values():
                    assert req.mode is not None
                    out.append(LockInfo(resource, req.owner.id, req.mode, True, req.since, kind))
                for req in entry.waiting:  # an upgrade is listed again here, as waiting
                    assert req.wanted is not None
                    out.append(LockInfo(resource, req.owner.id, req.wanted, False, req.since, kind))
        return out

    def waits_for(self) -> dict[int, set[int]]:
        """The waits-for graph: each waiting transaction's id → the ids it waits for."""
        graph: dict[int, set[int]] = {}
        with self._mutex:
            for _, entry in self._all_entries():
                if isinstance(entry, Queue):
                    for req in entry.waiting:
                        graph[req.owner.id] = {b.owner.id for b in entry.blockers(req)}
        return graph

    def _all_entries(self) -> Iterator[tuple[Any, Queue[Any] | Request[Mode]]]:
        yield from self._meta_queues.items()
        yield from self._queues.items()
        yield from self._range_queues.items()

    def stats(self) -> LockStats:
        with self._mutex:
            return LockStats(
                self._grants,
                self._waits,
                self._timeouts,
                self._deadlocks,
                self._escalations,
                self._wait_time,
            )

    # -- pieces shared by every lock call (mutex held unless noted) -----------------

    def _limit(self, coarse: bool, timeout: float | None) -> float:
        """The call's time limit: its class default, or the caller's value within its maximum."""
        if coarse:
            default, maximum, label = self.ddl_wait_timeout, self.max_ddl_wait_timeout, "ddl_"
        else:
            default, maximum, label = self.wait_timeout, self.max_wait_timeout, ""
        if timeout is None:
            return default
        _check_seconds("timeout", timeout, allow_inf=True)
        if maximum is not None and timeout > maximum:
            raise LockUsageError(
                f"timeout={timeout} s is above this manager's max_{label}wait_timeout={maximum} s; "
                f"wait less, or raise the maximum (None removes it)"
            )
        return timeout

    def _queue_for(self, kind: str, key: Any) -> Queue[Any]:
        """The queue of `key` in the lock table of `kind`, made on first use."""
        if kind == "data":
            return self._queue(key)
        if kind == "metadata":
            return self._meta_queue(key)
        return self._range_queue(key)

    def _queue(self, key: Hashable) -> Queue[Mode]:
        """The queue of `key`: made on first use, or from a solo lock on a second request."""
        entry = self._queues.get(key)
        if isinstance(entry, Queue):
            return entry
        queue = self._queues[key] = Queue(key)
        if entry is not None:
            mode, since = entry.mode, entry.since
            assert mode is not None
            entry.mode = None
            entry.queue = queue
            queue.add_granted(entry, mode)
            entry.since = since  # still the time it was granted
        return queue

    def _meta_queue(self, table: Hashable) -> Queue[Mode]:
        queue = self._meta_queues.get(table)
        if queue is None:
            queue = self._meta_queues[table] = MetadataQueue(table, self.metadata_exclusive_streak)
        return queue

    def _range_queue(self, key: tuple[Index, Hashable]) -> RangeQueue:
        queue = self._range_queues.get(key)
        if queue is None:
            queue = self._range_queues[key] = RangeQueue(key)
        return queue

    def _leave(self) -> None:
        """Release the mutex, then wake the waiters whose fate was decided under it.

        Waking after the release spares each woken thread an immediate block
        on the mutex its waker still holds. It is safe because a waiter reads
        its fate (granted, refused) under the mutex, never from the wake-up.
        """
        wakes = self._wakes
        if not wakes:
            self._release()
            return
        self._wakes = []
        self._release()
        for req in wakes:
            req.wake()

    def _wake_granted(self, queue: Queue[Any]) -> None:
        """Re-examine a queue after something left it, grant what it can, drop it if idle."""
        if queue.waiting:
            now = time.monotonic()
            for req, since in queue.grant_waiters():
                self._grants += 1
                self._wait_time += now - since
                req.owner.waiting_request = None
                self._wakes.append(req)
        if not queue.granted and not queue.waiting:
            del self._tables[queue.kind][queue.key]

    def _set_held(self, req: Request[Any], mode: Any) -> None:
        """Make a granted request hold `mode` instead (None: release it), then re-examine its queue.

        For a call giving back what it took (undo, and the insert intention
        once the insert is done). Not for `req` while it waits.
        """
        queue = req.in_queue
        if mode is None:
            queue.remove_granted(req)
            req.owner._forget(req, granted=True)
        else:
            queue.add_granted(req, mode)
        self._wake_granted(queue)

    def _refuse(self, req: Request[Any]) -> None:
        """Take a waiting request out of its queue (timeout, cancellation, deadlock victim)."""
        queue = req.in_queue
        queue.remove_waiting(req)
        self._wait_time += time.monotonic() - req.since
        if req.mode is None:
            req.owner._forget(req, granted=False)
        req.owner.waiting_request = None
        self._wake_granted(queue)

    def _resolve_deadlocks(self, txn: Txn) -> Deadlock | None:
        """Search for cycles through `txn`'s wait; refuse victims until none is left (L7).

        Returns the error when `txn` itself was the victim (its request has
        been refused; the caller fails its call). Other victims get theirs
        through `failure` and a wake-up.
        """
        req = txn.waiting_request
        assert req is not None
        while req.wanted is not None:
            found = find_cycle(txn, self.deadlock_max_steps, self.deadlock_max_depth)
            if found is None:
                return None
            path, complete = found
            victim = _choose_victim(self.victim, path) if complete else txn
            self._deadlocks += 1
            error = _deadlock_error(victim, path, complete)
            victim_req = victim.waiting_request
            assert victim_req is not None
            self._refuse(victim_req)
            if victim is txn:
                return error
            victim_req.failure = error
            self._wakes.append(victim_req)
        return None


class _Critical:
    """``with mgr._critical:`` holds the mutex and delivers wake-ups after releasing it."""

    __slots__ = ("_mgr",)

    def __init__(self, manager: LockManager) -> None:
        self._mgr = manager

    def __enter__(self) -> None:
        self._mgr._acquire()

    def __exit__(self, *exc: object) -> None:
        self._mgr._leave()


class Txn:
    """An owner of locks: a transaction, in database terms.

    One txn waits for at most one request at a time; use one txn per thread
    or task of control. ``with mgr.begin() as txn:`` releases everything on exit.
    """

    __slots__ = (
        "_call",
        "_escalate_at",
        "_locks",
        "_meta",
        "_mgr",
        "_ranges",
        "id",
        "name",
        "waiting_request",
    )

    def __init__(self, manager: LockManager, txn_id: int, name: str | None) -> None:
        self._mgr = manager
        self.id = txn_id
        self.name = name
        self._locks: dict[Resource, Request[Mode]] = {}
        """Data locks, granted or queued (rule L3: one request per resource)."""
        self._meta: dict[Hashable, Request[Mode]] = {}
        """Metadata locks, by table."""
        self._ranges: dict[tuple[Index, Hashable], Request[RangeMode]] = {}
        """Range locks, by (index, key)."""
        self.waiting_request: Request[Any] | None = None
        self._call: _Call | None = None
        """The lock call in progress (it has waited, or waits): index changes adjust its undo."""
        self._escalate_at: dict[int, int] = {}
        """Child count at which escalation is tried again, by id of the parent request (L10)."""

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<Txn {self.id}{label}: {self._count()} locks>"

    def _count(self) -> int:
        return len(self._locks) + len(self._meta) + len(self._ranges)

    def _books(self, kind: str) -> dict[Any, Request[Any]]:
        """The txn's requests in the lock table of `kind` (a queue's `kind`)."""
        if kind == "data":
            return self._locks
        return self._meta if kind == "metadata" else self._ranges

    def __enter__(self) -> Txn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_all()

    # -- acquiring ---------------------------------------------------------------

    def lock(self, resource: Resource, mode: Mode | str, timeout: float | None = None) -> Mode:
        """Lock `resource` in `mode`, waiting at most `timeout` s (0: try once; None: the default).

        Ancestors get the intention locks they need first, root to leaf
        (unless the manager is strict). Returns the mode now held, which is
        stronger than `mode` when the txn already held something else.
        Raises `LockTimeout` or `Deadlock`; either way the txn holds exactly
        what it held before the call.
        """
        if mode.__class__ is not Mode:
            mode = Mode.parse(mode)
        mgr = self._mgr
        depth = len(resource) if type(resource) is tuple else 0
        if timeout is None and depth > 1 and (depth < mgr._depth or mode in _ROW_MODES):
            # The uncontended case, inline: the general path below specialised
            # to a resource nobody has locked, under a parent that already
            # holds the intention mode it needs. Same rule; no plan, no call,
            # and the lock is a solo lock (README, "Solo locks").
            mgr._acquire()
            try:
                parent = self._locks.get(resource[:-1])
                if (
                    parent is not None
                    and parent.mode in _FAST_PARENTS[mode]
                    and self.waiting_request is None
                ):
                    req = Request(self, None, mode, None, parent)
                    if mgr._queues.setdefault(resource, req) is req:  # nobody had it
                        self._locks[resource] = req
                        parent.children += 1
                        mgr._grants += 1
                        if parent.children > mgr._escalation_floor:
                            _maybe_escalate(self, parent, resource[:-1])
                        return mode
            except TypeError:
                pass  # an unhashable part: the general path says so
            finally:
                if mgr._wakes:  # only after an escalation
                    mgr._leave()
                else:
                    mgr._release()
        call = self._start(resource, mode, timeout, None)
        return call if isinstance(call, Mode) else self._drive(call)

    async def lock_async(
        self, resource: Resource, mode: Mode | str, timeout: float | None = None
    ) -> Mode:
        """`lock` for asyncio: a wait suspends the task, not a thread.

        Cancelling the task removes its request and undoes whatever the call
        had acquired, then re-raises `asyncio.CancelledError`.
        """
        call = self._start(resource, _as_mode(mode), timeout, asyncio.get_running_loop())
        return call if isinstance(call, Mode) else await self._drive_async(call)

    def lock_metadata(
        self, table: Hashable, mode: Mode | str, timeout: float | None = None
    ) -> Mode:
        """Take the metadata lock of `table`: S to use the table, X to change its definition (L8).

        Needs a manager created with ``metadata_locks=True``. S is taken
        automatically before the first data lock on a table (unless strict);
        X waits like a table lock (``ddl_wait_timeout``), S like a row lock.
        """
        mode = _as_mode(mode)
        mgr = self._mgr
        if not mgr.metadata_locks:
            raise LockUsageError(
                "metadata locks are off for this manager; create it with metadata_locks=True"
            )
        if mode not in _ROW_MODES:
            raise LockUsageError(f"a metadata lock is S (use) or X (DDL), not {mode.value}")
        limit = mgr._limit(mode is Mode.X, timeout)
        try:
            hash(table)
        except TypeError:
            raise LockUsageError(f"a table name must be hashable: {table!r}") from None
        with mgr._critical:
            self._check_not_waiting()
            call = _Call(self, iter([("metadata", table, mode)]), limit, None)
        return self._drive(call)  # type: ignore[no-any-return]

    # -- range locks (part R; ranges.py) ------------------------------------------------

    def lock_key(
        self,
        index: Index,
        key: Any,
        kind: Kind | str,
        mode: Mode | str,
        timeout: float | None = None,
    ) -> RangeMode:
        """Lock `key` of `index`: the record, the gap below it, both (next-key), or an insert.

        `key` is in the index or is `SUPREMUM` (whose gap is the one above
        the last key; it has no record, so a next-key lock there is a gap
        lock). Range locks wait like row locks (``wait_timeout``). Returns the
        range mode now held on the key, the join of this request and any
        earlier one (or the request itself when a table lock already covers
        it). Raises `LockTimeout` or `Deadlock`; either way the txn then holds
        what it held before the call.
        """
        call = self._key_call(index, key, kind, mode, timeout=timeout, loop=None)
        return call if isinstance(call, RangeMode) else self._drive(call)

    async def lock_key_async(
        self,
        index: Index,
        key: Any,
        kind: Kind | str,
        mode: Mode | str,
        timeout: float | None = None,
    ) -> RangeMode:
        """`lock_key` for asyncio: a wait suspends the task; cancelling it withdraws the request."""
        loop = asyncio.get_running_loop()
        call = self._key_call(index, key, kind, mode, timeout=timeout, loop=loop)
        return call if isinstance(call, RangeMode) else await self._drive_async(call)

    def lock_range(
        self, index: Index, lo: Any, hi: Any, mode: Mode | str, timeout: float | None = None
    ) -> list[Any]:
        """Lock the keys from `lo` to `hi` and every gap between them against inserts (R4).

        Takes a next-key lock on each key of the index in ``[lo, hi]`` and a
        gap lock on the first key above `hi` (or the supremum), so no key can
        enter the range until this txn releases. ``hi=SUPREMUM`` runs to the
        end. Returns the keys in the range, which stay as they are while the
        locks are held (unless `Index.remove` is called regardless of locks).
        """
        call = self._range_call(index, lo, hi, mode, timeout=timeout, loop=None)
        if isinstance(call, _Call):
            self._drive(call)
        return index.keys(lo, hi)

    async def lock_range_async(
        self, index: Index, lo: Any, hi: Any, mode: Mode | str, timeout: float | None = None
    ) -> list[Any]:
        """`lock_range` for asyncio."""
        loop = asyncio.get_running_loop()
        call = self._range_call(index, lo, hi, mode, timeout=timeout, loop=loop)
        if isinstance(call, _Call):
            await self._drive_async(call)
        return index.keys(lo, hi)

    def insert(self, index: Index, key: Any, timeout: float | None = None) -> None:
        """Put `key` into `index` the way InnoDB inserts a record (R3).

        Waits until no other owner holds a gap lock on the next key (an
        insert intention), then adds the key; gap locks on the next key are
        copied to it, since its gap was split in two. The txn then holds an
        X record lock on the new key (what InnoDB keeps implicit), so nobody
        reads or locks it before this txn ends. Raises `LockUsageError` if the
        key is there already (also if it arrived while this call waited);
        `LockTimeout` or `Deadlock` like any lock call. The intention is given
        back when the insert is done or fails — one this txn took itself on
        that key beforehand too (see README.md, "Range locks").
        """
        call = self._insert_call(index, key, timeout=timeout, loop=None)
        if isinstance(call, _Call):
            self._drive(call)

    async def insert_async(self, index: Index, key: Any, timeout: float | None = None) -> None:
        """`insert` for asyncio."""
        loop = asyncio.get_running_loop()
        call = self._insert_call(index, key, timeout=timeout, loop=loop)
        if isinstance(call, _Call):
            await self._drive_async(call)

    def _key_call(
        self,
        index: Index,
        key: Any,
        kind: Kind | str,
        mode: Mode | str,
        *,
        timeout: float | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> _Call | RangeMode:
        wanted = RangeMode.of(_as_kind(kind), _as_key_mode(mode))
        if key is SUPREMUM:
            if wanted.without_record is None:
                raise LockUsageError(
                    "the supremum is not a record: lock its gap (Kind.GAP or Kind.NEXT_KEY)"
                )
            wanted = wanted.without_record

        def plan() -> Iterator[Step] | RangeMode:
            if key is not SUPREMUM and not index._has(key):
                raise LockUsageError(
                    f"key {key!r} is not in index {index.name!r}: lock the gap it would fall in "
                    f"(index.next_key(key)), or use lock_range(index, key, key, ...)"
                )
            steps = self._plan("range", (index, key), wanted, *self._above(index))
            return wanted if isinstance(steps, Mode) else steps  # covered by a table lock

        return self._call_with(plan, self._range_limit(index, timeout), loop)

    def _range_call(
        self,
        index: Index,
        lo: Any,
        hi: Any,
        mode: Mode | str,
        *,
        timeout: float | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> _Call | Mode:
        mode = _as_key_mode(mode)
        scan = RangeMode.of(Kind.NEXT_KEY, mode)

        def plan() -> Iterator[Step] | Mode:
            if index._position(hi) < index._position(lo):
                raise LockUsageError(f"an empty range: lo={lo!r} is above hi={hi!r}")
            above = self._ancestor_steps(index.name, scan, *self._above(index))
            if not isinstance(above, list):  # a table lock covers the scan
                return above
            return itertools.chain(above, scan_steps(index, lo, hi, mode))

        return self._call_with(plan, self._range_limit(index, timeout), loop)

    def _insert_call(
        self,
        index: Index,
        key: Any,
        *,
        timeout: float | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> _Call | Mode:
        if key is SUPREMUM:
            raise LockUsageError("the supremum is not a key: it cannot be inserted")
        intention = RangeMode.of(Kind.INSERT_INTENTION, Mode.X)

        def plan() -> Iterator[Step] | Mode:
            index._absent(key)
            above = self._ancestor_steps(index.name, intention, *self._above(index))
            if not isinstance(above, list):  # X on the table: nobody else can be in the way
                index._add(key)
                return above
            return itertools.chain(above, insert_steps(self, index, key))

        return self._call_with(plan, self._range_limit(index, timeout), loop)

    def _range_limit(self, index: Index, timeout: float | None) -> float:
        """The time limit of a range call (range locks are row locks); checks the index first."""
        if not isinstance(index, Index) or index._mgr is not self._mgr:
            raise LockUsageError(
                f"{index!r} is not an index of this txn's manager: get one with mgr.index(name)"
            )
        return self._mgr._limit(False, timeout)

    def unlock_key(self, index: Index, key: Any) -> None:
        """Release this txn's range lock on `key` of `index` (before the txn ends: not 2PL)."""
        with self._mgr._critical:
            req = self._ranges.get((index, key))
            if req is None or req.mode is None or req.wanted is not None:
                raise LockUsageError(
                    f"txn {self.id} holds no range lock on {key!r} of index {index.name!r} "
                    f"(or is waiting to upgrade it)"
                )
            self._drop(req)

    def held_key(self, index: Index, key: Any) -> RangeMode | None:
        """The range lock this txn holds on `key` of `index` (not what a table lock implies)."""
        with self._mgr._mutex:
            req = self._ranges.get((index, key))
            return req.mode if req is not None else None

    def _above(self, index: Index) -> tuple[Resource, Hashable | None]:
        """The path above a key of `index` and the table whose metadata lock comes first."""
        table = index.table
        if table is None:
            return (), None
        return table, table[0] if self._mgr.metadata_locks else None

    def _drive(self, call: _Call) -> Any:
        """Block the thread through the call's waits (each on its own gate) until it ends."""
        req = call.first
        while req is not None:
            remaining = min(call.deadline - time.monotonic(), threading.TIMEOUT_MAX)
            gate: threading.Lock = req.signal
            woke = gate.acquire(True, remaining) if remaining > 0 else gate.acquire(False)
            req = call.resume(req, woke)
        return call.result

    async def _drive_async(self, call: _Call) -> Any:
        """`_drive` for asyncio: a wait suspends the task; cancelling it withdraws the request."""
        req = call.first
        while req is not None:
            future: asyncio.Future[None] = req.signal
            woke = True
            left = call.deadline - time.monotonic()
            try:
                async with asyncio.timeout(None if left == math.inf else max(0.0, left)):
                    await future
            except TimeoutError:
                woke = False
            except asyncio.CancelledError:
                call.cancel(req)
                raise
            req = call.resume(req, woke)
        return call.result

    def _start(
        self,
        resource: Resource,
        mode: Mode,
        timeout: float | None,
        loop: asyncio.AbstractEventLoop | None,
    ) -> _Call | Mode:
        """Check the call, then plan it and take every step that need not wait.

        Returns the mode held when there was nothing to do, else the call,
        whose `first` is the request it is waiting for (None when done).
        """
        mgr = self._mgr
        _check_resource(mgr, resource, mode)
        coarse = mode not in _INTENTIONS and len(resource) < mgr._depth
        table = resource[0] if mgr.metadata_locks else None
        return self._call_with(
            lambda: self._plan("data", resource, mode, resource[:-1], table),
            mgr._limit(coarse, timeout),
            loop,
        )

    def _call_with(
        self,
        plan: Callable[[], Iterator[Step] | T],
        limit: float,
        loop: asyncio.AbstractEventLoop | None,
    ) -> _Call | T:
        """Plan a call under the mutex and take every step that need not wait.

        `plan` returns the steps, or the call's result when there is nothing
        to lock. The call's `first` is the request it waits for (None: done).
        """
        with self._mgr._critical:
            self._check_not_waiting()
            steps = plan()
            if not isinstance(steps, Iterator):
                return steps
            return _Call(self, steps, limit, loop)

    def _check_not_waiting(self) -> None:
        if self.waiting_request is not None:
            raise LockUsageError(
                f"txn {self.id} is already waiting for a lock (in another thread or task); "
                f"use one txn per thread of control"
            )

    def _plan(
        self, kind: str, key: Hashable, mode: Any, above: Resource, table: Hashable | None
    ) -> Iterator[Step] | Any:
        """The steps of a lock call on one key, root to leaf; or the mode held if that covers it."""
        mine = self._books(kind).get(key)
        if mine is not None and mine.mode is not None and mine.mode.covers(mode):
            return mine.mode
        steps = self._ancestor_steps(key, mode, above, table)
        if not isinstance(steps, list):
            return steps
        steps.append((kind, key, mode))
        return iter(steps)

    def _ancestor_steps(
        self, what: object, mode: Any, above: Resource, table: Hashable | None
    ) -> list[Step] | Mode:
        """The locks needed above `what` before it is locked in `mode`, root to leaf.

        `above` is the path of its parent (every prefix is an ancestor) and
        `table` the table whose metadata lock comes first, if metadata locks
        are on. Returns the mode an ancestor's lock implies on `what`
        instead, when that covers `mode` (rule L2).
        """
        mgr = self._mgr
        steps: list[Step] = []
        if table is not None and table not in self._meta:
            if mgr.strict:
                raise LockUsageError(
                    f"strict mode: take the metadata lock of {table!r} "
                    f"(txn.lock_metadata(..., Mode.S)) before locking {what!r}"
                )
            steps.append(("metadata", table, Mode.S))
        need = mode.parent_intention
        for depth in range(1, len(above) + 1):
            ancestor = above[:depth]
            held = self._locks.get(ancestor)
            held_mode = held.mode if held is not None else None
            if held_mode is not None:
                implied = held_mode.implied_on_descendants
                # S on an ancestor implies every read below it, X everything.
                if implied is Mode.X or (implied is Mode.S and need is Mode.IS):
                    return implied
                if held_mode.covers(need):
                    continue
            if mgr.strict:
                raise LockUsageError(
                    f"strict mode: lock {ancestor!r} in {need.value} or stronger "
                    f"before locking {what!r} in {mode.value}"
                )
            steps.append(("data", ancestor, need))
        return steps

    # -- releasing ---------------------------------------------------------------

    def unlock(self, resource: Resource) -> None:
        """Release the lock on `resource`. Its children must be released first."""
        mgr = self._mgr
        mgr._acquire()
        try:
            req = self._locks.get(resource)
            if req is not None and req.mode is not None and not req.children and req.wanted is None:
                if req.queue is None:  # a solo lock: nobody else to wake
                    del mgr._queues[resource]
                    del self._locks[resource]
                    if req.parent is not None:
                        req.parent.children -= 1
                    return
                self._drop(req)
                return
            raise LockUsageError(self._why_not_unlockable(resource, req))
        finally:
            if mgr._wakes:
                mgr._leave()
            else:
                mgr._release()

    def _why_not_unlockable(self, resource: Resource, req: Request[Mode] | None) -> str:
        if req is None or req.mode is None:
            for depth in range(1, len(resource)):
                above = self._locks.get(resource[:depth])
                if (
                    above is not None
                    and above.mode is not None
                    and above.mode.implied_on_descendants
                ):
                    return (
                        f"txn {self.id} holds {resource!r} only through its {above.mode.value} "
                        f"lock on {resource[:depth]!r} (taken explicitly or by lock escalation); "
                        f"unlock {resource[:depth]!r} instead"
                    )
            return f"txn {self.id} holds no lock on {resource!r}"
        if req.children:
            return (
                f"txn {self.id} still holds {req.children} lock(s) under {resource!r}; "
                f"unlock them first, or release_all()"
            )
        return (
            f"txn {self.id} is waiting to upgrade its lock on {resource!r} "
            f"(in another thread or task); it cannot be released now"
        )

    def unlock_metadata(self, table: Hashable) -> None:
        """Release the metadata lock of `table`. Data locks on the table must be released first."""
        with self._mgr._critical:
            req = self._meta.get(table)
            if req is None or req.mode is None or req.wanted is not None:
                raise LockUsageError(f"txn {self.id} holds no metadata lock on {table!r}")
            if (table,) in self._locks:
                raise LockUsageError(
                    f"txn {self.id} still holds data locks on {table!r}; unlock them first"
                )
            self._drop(req)

    def release_all(self) -> None:
        """Release every lock this txn holds."""
        mgr = self._mgr
        with mgr._critical:
            if self.waiting_request is not None:
                raise LockUsageError(
                    f"txn {self.id} is waiting for a lock in another thread or task; "
                    f"release_all() would pull the locks from under that call"
                )
            touched: dict[int, Queue[Any]] = {}
            for key, req in self._locks.items():
                queue = req.queue
                if queue is None:  # a solo lock
                    del mgr._queues[key]
                    continue
                queue.remove_granted(req)
                touched[id(queue)] = queue
            queued: list[Request[Any]] = [*self._meta.values(), *self._ranges.values()]
            for held in queued:
                held.in_queue.remove_granted(held)
                touched[id(held.in_queue)] = held.in_queue
            self._locks.clear()
            self._meta.clear()
            self._ranges.clear()
            self._escalate_at.clear()
            for queue in touched.values():
                mgr._wake_granted(queue)

    def _drop(self, req: Request[Any]) -> None:
        """Release one granted request and re-examine its queue."""
        queue = req.in_queue
        queue.remove_granted(req)
        self._forget(req, granted=True)
        self._mgr._wake_granted(queue)

    def _forget(self, req: Request[Any], *, granted: bool) -> None:
        """Remove `req` from this txn's books (and, if it was granted, from its parent's count)."""
        queue = req.in_queue
        del self._books(queue.kind)[queue.key]
        if granted and req.parent is not None:
            req.parent.children -= 1
            req.parent = None

    def _adopt(self, req: Request[Any]) -> Request[Mode] | None:
        """Book a granted request: in this txn's books, and counted under its parent's request.

        Returns the parent request when this one was newly counted under it.
        """
        queue = req.in_queue
        self._books(queue.kind)[queue.key] = req
        if req.parent is not None:
            return None
        parent_key = queue.parent_key
        parent = self._locks.get(parent_key) if type(parent_key) is tuple else None
        if parent is not None:
            req.parent = parent
            parent.children += 1
        return parent

    # -- reading -----------------------------------------------------------------

    def held(self, resource: Resource) -> Mode | None:
        """The mode this txn effectively holds on `resource`, or None.

        Includes what ancestors imply: after S on ``("orders",)`` every row of
        it is held in S, whether or not it was locked one by one.
        """
        with self._mgr._mutex:
            req = self._locks.get(resource)
            mode = req.mode if req is not None else None
            for depth in range(1, len(resource)):
                above = self._locks.get(resource[:depth])
                implied = above.mode.implied_on_descendants if above and above.mode else None
                if implied is not None:
                    mode = implied if mode is None else mode.join(implied)
            return mode

    def held_metadata(self, table: Hashable) -> Mode | None:
        """The metadata lock this txn holds on `table`, or None."""
        with self._mgr._mutex:
            req = self._meta.get(table)
            return req.mode if req is not None else None


class _Call:
    """One lock call in progress: its steps root to leaf, and how to undo them.

    A call that fails (timeout, deadlock, cancellation) undoes the steps it
    completed, so the txn holds exactly what it held before the call. The
    constructor and `cancel` run under the manager mutex; `resume` takes it.

    Steps come from an iterator, taken one at a time under the mutex, so a
    range call can decide its next key from the index as it is after a wait.
    """

    __slots__ = (
        "deadline",
        "first",
        "grown",
        "inserting",
        "limit",
        "loop",
        "result",
        "steps",
        "txn",
        "undo",
    )

    def __init__(
        self,
        txn: Txn,
        steps: Iterator[Step],
        limit: float,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.txn = txn
        self.steps = steps
        self.limit = limit
        self.deadline = time.monotonic() + limit
        self.loop = loop
        self.undo: dict[Request[Any], Any] = {}
        """Each request the call changed → what it held before the call (None: nothing).

        Undo restores each to that, which is the same whatever order the steps
        came in. Index changes during the call rewrite the entries of the
        requests they move (ranges.py), so the undo stays exact."""
        self.result: Any = None
        self.inserting: Inserting | None = None
        """The insert this call makes, if it is `Txn.insert` (ranges.py, `insert_steps`)."""
        self.grown: dict[int, tuple[Request[Mode], Any]] = {}
        """Parents that counted a new child in this call (by id), for escalation once it
        succeeds: a call that escalates never has to undo an escalation."""
        txn._call = self
        self.first = self._advance()
        """The request the call waits for after its first burst of steps (None: done)."""

    def _advance(self) -> Request[Any] | None:
        """Take steps until one must wait; return that request (queued), or None when done."""
        txn = self.txn
        mgr = txn._mgr
        try:
            for kind, key, step_mode in self.steps:
                books = txn._books(kind)
                req = books.get(key)
                before = None
                mode = step_mode
                if req is not None:
                    before = req.mode
                    assert before is not None
                    if before.covers(mode):
                        self.result = before
                        continue
                    mode = before.join(mode)
                    queue = req.queue or mgr._queue_for(kind, key)
                else:
                    queue = mgr._queue_for(kind, key)
                    req = Request(txn, queue, None, None)
                self.undo.setdefault(req, before)
                if not queue.blocked_on_arrival(req, mode):
                    queue.add_granted(req, mode)
                    queue.granted_one(req)
                    mgr._grants += 1
                    self._book(req)
                    continue
                if self.deadline <= time.monotonic():
                    raise self._failed(self._timeout(req, mode))
                if before is None:
                    books[key] = req
                queue.enqueue(req, mode)
                self._arm(req)
                txn.waiting_request = req
                mgr._waits += 1
                error = mgr._resolve_deadlocks(txn)
                if error is not None:
                    raise self._failed(error)
                return req
        except LockUsageError as error:  # a range call found the index changed under it
            raise self._failed(error) from None
        txn._call = None
        for parent, parent_key in self.grown.values():
            if parent.children > mgr._escalation_floor:
                _maybe_escalate(txn, parent, parent_key)
        return None

    def _book(self, req: Request[Any]) -> None:
        """A step was granted: book it in the txn, under its parent."""
        self.result = req.mode
        parent = self.txn._adopt(req)
        if parent is not None:
            self.grown[id(parent)] = (parent, req.in_queue.parent_key)

    def _arm(self, req: Request[Any]) -> None:
        """Give the waiting request something to block on, and the way to release it."""
        if self.loop is None:
            gate = threading.Lock()
            gate.acquire()
            req.arm(gate, gate.release)
        else:
            future = self.loop.create_future()
            loop = self.loop
            req.arm(future, lambda: loop.call_soon_threadsafe(_settle, future))

    def resume(self, req: Request[Any], woke: bool) -> Request[Any] | None:
        """After a wait on `req`: carry on with the next step, or fail cleanly."""
        mgr = self.txn._mgr
        mgr._acquire()  # not `with mgr._critical`: this is every waiter's hand-off path
        try:
            if req.failure is not None:
                raise self._failed(req.failure)
            if req.wanted is None:  # granted (even if the wake raced a timeout)
                self._book(req)
                return self._advance()
            assert not woke, "woken, but neither granted nor refused"
            mgr._timeouts += 1
            error = self._timeout(req, req.wanted)
            mgr._refuse(req)
            raise self._failed(error)
        finally:
            mgr._leave()

    def cancel(self, req: Request[Any]) -> None:
        """The waiting task was cancelled: withdraw the request and undo the call."""
        with self.txn._mgr._critical:
            if req.failure is None:
                if req.wanted is not None:
                    self.txn._mgr._refuse(req)
                else:  # granted just before the cancellation landed
                    self.txn._adopt(req)
            self.txn.waiting_request = None
            self._rollback()

    def _failed(self, error: BaseException) -> BaseException:
        self.txn.waiting_request = None
        self._rollback()
        return error

    def _rollback(self) -> None:
        """Give back what this call acquired, newest first."""
        mgr = self.txn._mgr
        self.txn._call = None
        for req, before in reversed(self.undo.items()):
            if req.mode is not None:
                mgr._set_held(req, before)
            else:  # refused while new, or an insert intention given back: nothing held before
                assert before is None
        self.undo.clear()

    def _timeout(self, req: Request[Any], mode: Any) -> LockTimeout:
        queue = req.in_queue
        blockers = tuple(_blocker_ids(queue, req, mode))
        what = {"metadata": "metadata lock", "range": "range lock"}.get(queue.kind, "lock")
        tried = "a try" if self.limit == 0 else f"{self.limit:g} s"
        return LockTimeout(
            f"txn {self.txn.id} could not get {what} {mode.value} on {queue.resource!r} "
            f"({tried}); blocked by txn {', '.join(map(str, blockers))}",
            resource=queue.resource,
            mode=mode,
            timeout=self.limit,
            blockers=blockers,
        )


def _maybe_escalate(txn: Txn, parent: Request[Mode], parent_key: Resource) -> None:
    """Escalate a parent of rows holding more than the threshold (L10), retrying now and then."""
    if len(parent_key) == txn._mgr._depth - 1 and parent.children >= txn._escalate_at.get(
        id(parent), 0
    ):
        _escalate(txn, parent, parent_key)


def _escalate(txn: Txn, parent: Request[Mode], parent_key: Resource) -> None:
    """Try (never wait) to replace the rows under `parent` by one S or X lock on it.

    The keys of indexes on the table are its rows too: S on the table gives
    every read a range lock gives (no other owner can insert or write without
    IX), X everything.
    """
    mgr = txn._mgr
    assert parent.mode is not None
    queue = parent.queue or mgr._queue(parent_key)  # a solo parent gets its queue now
    rows: list[tuple[dict[Any, Any], Any, Request[Any]]] = [
        (books, key, row)
        for books in (txn._locks, txn._ranges)
        for key, row in books.items()
        if row.parent is parent
    ]
    writes = any(row.mode is not None and row.mode.parent_intention is Mode.IX for *_, row in rows)
    target = parent.mode.join(Mode.X if writes else Mode.S)
    if queue.blocked_on_arrival(parent, target):
        txn._escalate_at[id(parent)] = parent.children + mgr.escalation_retry
        return
    queue.add_granted(parent, target)
    mgr._escalations += 1
    for books, key, row in rows:
        del books[key]
        row.parent = None
        row_queue = row.queue
        if row_queue is None:  # a solo lock
            del mgr._queues[key]
        else:
            row_queue.remove_granted(row)
            mgr._wake_granted(row_queue)
    parent.children = 0
    txn._escalate_at.pop(id(parent), None)


def _choose_victim(policy: Victim, cycle: list[Txn]) -> Txn:
    if policy == "youngest":
        return max(cycle, key=lambda t: t.id)
    if policy == "fewest_locks":
        return min(cycle, key=lambda t: (t._count(), -t.id))
    return cycle[0]


def _deadlock_error(victim: Txn, path: list[Txn], complete: bool) -> Deadlock:
    req = victim.waiting_request
    assert req is not None and req.wanted is not None
    ids = [t.id for t in path]
    start = ids.index(victim.id) if victim.id in ids else 0
    cycle = tuple(ids[start:] + ids[:start])
    if complete:
        shown = " -> ".join(map(str, (*cycle, cycle[0])))
        reason = f"waiting would close the cycle {shown}"
    else:
        reason = (
            "the deadlock search hit its bound (deadlock_max_steps / deadlock_max_depth), "
            "which counts as a deadlock"
        )
    return Deadlock(
        f"txn {victim.id} refused {req.wanted.value} on {req.in_queue.resource!r}: {reason}; "
        f"release its locks (or retry the transaction) to let the others through",
        resource=req.in_queue.resource,
        mode=req.wanted,
        cycle=cycle,
    )


def _blocker_ids(queue: Queue[Any], req: Request[Any], mode: Any) -> list[int]:
    if req.wanted is not None:
        return [r.owner.id for r in queue.blockers(req)]
    # Not queued (a failed try): everyone it would have waited for.
    owner = req.owner
    ids = [
        r.owner.id
        for r in queue.granted.values()
        if r.owner is not owner and queue.blocks(r.mode, mode)
    ]
    ids += [
        r.owner.id
        for r in queue.waiting[: queue.position_for(req, mode)]
        if r.owner is not owner and queue.blocks(r.wanted, mode)
    ]
    return ids


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _as_mode(mode: Mode | str) -> Mode:
    return mode if mode.__class__ is Mode else Mode.parse(mode)


def _as_key_mode(mode: Mode | str) -> Mode:
    mode = _as_mode(mode)
    if mode not in _ROW_MODES:
        raise LockUsageError(
            f"a key is locked in S or X, not {mode.value}: intention modes are for tables "
            f"(a range lock takes the one it needs on its index's table by itself)"
        )
    return mode


def _as_kind(kind: Kind | str) -> Kind:
    if isinstance(kind, Kind):
        return kind
    try:
        return Kind(kind)
    except ValueError:
        raise LockUsageError(
            f"unknown kind of range lock {kind!r}: use one of "
            f"{', '.join(repr(k.value) for k in Kind)} (or Kind.RECORD, ...)"
        ) from None


def _check_resource(mgr: LockManager, resource: object, mode: Mode) -> None:
    if type(resource) is not tuple or not 0 < len(resource) <= mgr._depth:
        levels = ", ".join(mgr.levels)
        raise LockUsageError(
            f"a resource is a tuple of 1 to {mgr._depth} parts ({levels}), got {resource!r}"
        )
    if len(resource) == mgr._depth and mode not in _ROW_MODES:
        raise LockUsageError(
            f"a {mgr.levels[-1]} (the last level) is locked in S or X only, not {mode.value}: "
            f"intention modes announce locks on children, and it has none"
        )
    try:
        hash(resource)
    except TypeError:
        raise LockUsageError(f"every part of a resource must be hashable: {resource!r}") from None


def _check_seconds(name: str, value: object, *, allow_inf: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LockUsageError(f"{name} must be a number of seconds, got {value!r}")
    if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_inf):
        raise LockUsageError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LockUsageError(f"{name} must be a positive integer, got {value!r}")
