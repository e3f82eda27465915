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
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Literal

from lockwarden.errors import Deadlock, LockTimeout, LockUsageError
from lockwarden.local._deadlock import find_cycle
from lockwarden.local._queue import MetadataQueue, Queue, Request
from lockwarden.modes import Mode

__all__ = ["LockInfo", "LockManager", "LockStats", "Txn"]

Resource = tuple[Hashable, ...]
Victim = Literal["requester", "youngest", "fewest_locks"]

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
    owner: int
    """The owning transaction's id."""
    mode: Mode
    granted: bool
    since: float
    """``time.monotonic()`` when it was granted, or when it started waiting."""
    kind: str = "data"
    """"data" for resource locks, "metadata" for a table's metadata lock."""


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
        self._queues: dict[Hashable, Queue | Request] = {}
        """The lock table. A resource is here only while something is granted or waiting
        (rule L4): as its `Queue`, or, while one owner holds it and nobody else has
        asked, as that owner's `Request` alone (a solo lock; README, "Solo locks")."""
        self._acquire = self._mutex.acquire
        self._release = self._mutex.release
        self._wakes: list[Request] = []
        """Waiters granted or refused under the mutex, to wake once it is released (`_leave`)."""
        self._critical = _Critical(self)
        self._meta_queues: dict[Hashable, Queue] = {}
        self._next_id = itertools.count(1).__next__
        # Counters (rule L11), plain attributes: the uncontended path bumps one.
        self._grants = self._waits = self._timeouts = self._deadlocks = self._escalations = 0
        self._wait_time = 0.0

    def begin(self, name: str | None = None) -> Txn:
        """A new owner of locks. Ids grow in `begin` order, so the youngest has the highest."""
        return Txn(self, self._next_id(), name)

    # -- introspection (rule L11) --------------------------------------------------

    def locks(self) -> list[LockInfo]:
        """A consistent snapshot of every granted lock and waiting request."""
        out: list[LockInfo] = []
        with self._mutex:
            for key, entry in self._all_entries():
                resource = key if type(key) is tuple else (key,)
                if isinstance(entry, Request):  # a solo lock
                    assert entry.mode is not None
                    out.append(LockInfo(resource, entry.owner.id, entry.mode, True, entry.since))
                    continue
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

    def _all_entries(self) -> Iterator[tuple[Hashable, Queue | Request]]:
        yield from self._meta_queues.items()
        yield from self._queues.items()

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

    def _queue(self, key: Hashable) -> Queue:
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

    def _meta_queue(self, table: Hashable) -> Queue:
        queue = self._meta_queues.get(table)
        if queue is None:
            queue = self._meta_queues[table] = MetadataQueue(table, self.metadata_exclusive_streak)
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

    def _wake_granted(self, queue: Queue) -> None:
        """Re-examine a queue after something left it, grant what it can, drop it if idle."""
        if queue.waiting:
            now = time.monotonic()
            for req in queue.grant_waiters():
                self._grants += 1
                self._wait_time += now - req.since
                req.owner.waiting_request = None
                self._wakes.append(req)
        if not queue.granted and not queue.waiting:
            del (self._meta_queues if queue.kind == "metadata" else self._queues)[queue.key]

    def _refuse(self, req: Request) -> None:
        """Take a waiting request out of its queue (timeout, cancellation, deadlock victim)."""
        queue = req.in_queue
        queue.remove_waiting(req)
        self._wait_time += time.monotonic() - req.since
        if req.mode is None:
            req.owner._forget(req, granted=False)
        req.owner.waiting_request = None
        self._wake_granted(queue)


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

    __slots__ = ("_escalate_at", "_locks", "_meta", "_mgr", "id", "name", "waiting_request")

    def __init__(self, manager: LockManager, txn_id: int, name: str | None) -> None:
        self._mgr = manager
        self.id = txn_id
        self.name = name
        self._locks: dict[Resource, Request] = {}
        """Data locks, granted or queued (rule L3: one request per resource)."""
        self._meta: dict[Hashable, Request] = {}
        """Metadata locks, by table."""
        self.waiting_request: Request | None = None
        self._escalate_at: dict[int, int] = {}
        """Child count at which escalation is tried again, by id of the parent request (L10)."""

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<Txn {self.id}{label}: {len(self._locks) + len(self._meta)} locks>"

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
        if isinstance(call, Mode):
            return call
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
            call = _Call(self, [(True, table, mode)], limit, None)
        return self._drive(call)

    def _drive(self, call: _Call) -> Mode:
        """Block the thread through the call's waits (each on its own gate) until it ends."""
        req = call.first
        while req is not None:
            remaining = min(call.deadline - time.monotonic(), threading.TIMEOUT_MAX)
            gate: threading.Lock = req.signal
            woke = gate.acquire(True, remaining) if remaining > 0 else gate.acquire(False)
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
        limit = mgr._limit(mode not in _INTENTIONS and len(resource) < mgr._depth, timeout)
        with mgr._critical:
            self._check_not_waiting()
            steps = self._plan(resource, mode)
            if isinstance(steps, Mode):
                return steps
            return _Call(self, steps, limit, loop)

    def _check_not_waiting(self) -> None:
        if self.waiting_request is not None:
            raise LockUsageError(
                f"txn {self.id} is already waiting for a lock (in another thread or task); "
                f"use one txn per thread of control"
            )

    def _plan(self, resource: Resource, mode: Mode) -> list[tuple[bool, Hashable, Mode]] | Mode:
        """The steps of a lock call, root to leaf; or the mode held if it already covers `mode`."""
        mine = self._locks.get(resource)
        if mine is not None and mine.mode is not None and mine.mode.covers(mode):
            return mine.mode
        mgr = self._mgr
        steps: list[tuple[bool, Hashable, Mode]] = []
        if mgr.metadata_locks and resource[0] not in self._meta:
            if mgr.strict:
                raise LockUsageError(
                    f"strict mode: take the metadata lock of {resource[0]!r} "
                    f"(txn.lock_metadata(..., Mode.S)) before locking {resource!r}"
                )
            steps.append((True, resource[0], Mode.S))
        need = mode.parent_intention
        for depth in range(1, len(resource)):
            ancestor = resource[:depth]
            held = self._locks.get(ancestor)
            held_mode = held.mode if held is not None else None
            if held_mode is not None:
                implied = held_mode.implied_on_descendants
                if implied is not None and implied.covers(mode):
                    return implied  # rule L2: S/SIX/X on an ancestor already covers it
                if held_mode.covers(need):
                    continue
            if mgr.strict:
                raise LockUsageError(
                    f"strict mode: lock {ancestor!r} in {need.value} or stronger "
                    f"before locking {resource!r} in {mode.value}"
                )
            steps.append((False, ancestor, need))
        steps.append((False, resource, mode))
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

    def _why_not_unlockable(self, resource: Resource, req: Request | None) -> str:
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
            touched: dict[int, Queue] = {}
            for key, req in self._locks.items():
                queue = req.queue
                if queue is None:  # a solo lock
                    del mgr._queues[key]
                    continue
                queue.remove_granted(req)
                touched[id(queue)] = queue
            for req in self._meta.values():
                req.in_queue.remove_granted(req)
                touched[id(req.in_queue)] = req.in_queue
            self._locks.clear()
            self._meta.clear()
            self._escalate_at.clear()
            for queue in touched.values():
                mgr._wake_granted(queue)

    def _drop(self, req: Request) -> None:
        """Release one granted request and re-examine its queue."""
        queue = req.in_queue
        queue.remove_granted(req)
        self._forget(req, granted=True)
        self._mgr._wake_granted(queue)

    def _forget(self, req: Request, *, granted: bool) -> None:
        """Remove `req` from this txn's books (and, if it was granted, from its parent's count)."""
        key = req.in_queue.key
        if req.in_queue.kind == "metadata":
            del self._meta[key]
            return
        del self._locks[key]  # type: ignore[arg-type]
        if granted and req.parent is not None:
            req.parent.children -= 1
            req.parent = None

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
    """

    __slots__ = (
        "deadline",
        "first",
        "limit",
        "loop",
        "pending_before",
        "result",
        "started",
        "steps",
        "txn",
        "undo",
    )

    def __init__(
        self,
        txn: Txn,
        steps: list[tuple[bool, Hashable, Mode]],
        limit: float,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.txn = txn
        self.steps = steps
        self.limit = limit
        self.deadline = time.monotonic() + limit
        self.loop = loop
        self.undo: list[tuple[Request, Mode | None]] = []
        self.result = steps[-1][2]
        self.started = 0
        self.pending_before: Mode | None = None
        """What the waiting step's request held before it queued (None: a new request)."""
        self.first = self._advance()
        """The request the call waits for after its first burst of steps (None: done)."""

    def _advance(self) -> Request | None:
        """Take steps until one must wait; return that request (queued), or None when done."""
        txn = self.txn
        mgr = txn._mgr
        steps = self.steps
        while self.started < len(steps):
            is_meta, key, mode = steps[self.started]
            self.started += 1
            books: dict[Hashable, Request] = txn._meta if is_meta else txn._locks  # type: ignore[assignment]
            req = books.get(key)
            before = None
            if req is not None:
                before = req.mode
                assert before is not None
                if before.covers(mode):
                    self.result = before
                    continue
                mode = before.join(mode)
                queue = req.queue or mgr._queue(key)
            else:
                queue = mgr._meta_queue(key) if is_meta else mgr._queue(key)
                req = Request(txn, queue, None, None)
            if not queue.blocked_on_arrival(req, mode):
                queue.add_granted(req, mode)
                queue.granted_one(req)
                mgr._grants += 1
                self._record(req, before)
                continue
            if self.deadline <= time.monotonic():
                raise self._failed(self._timeout(req, mode))
            if before is None:
                books[key] = req
            queue.enqueue(req, mode)
            self._arm(req)
            self.pending_before = before
            txn.waiting_request = req
            mgr._waits += 1
            self._check_deadlock(req)
            return req
        return None

    def _record(self, req: Request, before: Mode | None, *, escalate: bool = True) -> None:
        """Book a granted step: in the txn's books, under its parent, in the undo log."""
        txn = self.txn
        self.undo.append((req, before))
        assert req.mode is not None
        self.result = req.mode
        if before is not None:
            return
        key = req.in_queue.key
        if req.in_queue.kind == "metadata":
            txn._meta[key] = req
            return
        txn._locks[key] = req  # type: ignore[index]
        if len(key) > 1:  # type: ignore[arg-type]
            parent = txn._locks.get(key[:-1])  # type: ignore[index]
            if parent is not None:
                req.parent = parent
                parent.children += 1
                if escalate and parent.children > txn._mgr._escalation_floor:
                    _maybe_escalate(txn, parent, key[:-1])  # type: ignore[index]

    def _arm(self, req: Request) -> None:
        """Give the waiting request something to block on, and the way to release it."""
        if self.loop is None:
            gate = threading.Lock()
            gate.acquire()
            req.arm(gate, gate.release)
        else:
            future = self.loop.create_future()
            loop = self.loop
            req.arm(future, lambda: loop.call_soon_threadsafe(_settle, future))

    def resume(self, req: Request, woke: bool) -> Request | None:
        """After a wait on `req`: carry on with the next step, or fail cleanly."""
        mgr = self.txn._mgr
        mgr._acquire()  # not `with mgr._critical`: this is every waiter's hand-off path
        try:
            if req.failure is not None:
                raise self._failed(req.failure)
            if req.wanted is None:  # granted (even if the wake raced a timeout)
                self._record(req, self.pending_before)
                return self._advance()
            assert not woke, "woken, but neither granted nor refused"
            mgr._timeouts += 1
            error = self._timeout(req, req.wanted)
            mgr._refuse(req)
            raise self._failed(error)
        finally:
            mgr._leave()

    def cancel(self, req: Request) -> None:
        """The waiting task was cancelled: withdraw the request and undo the call."""
        with self.txn._mgr._critical:
            if req.failure is None:
                if req.wanted is not None:
                    self.txn._mgr._refuse(req)
                else:  # granted just before the cancellation landed
                    self._record(req, self.pending_before, escalate=False)
            self.txn.waiting_request = None
            self._rollback()

    def _failed(self, error: BaseException) -> BaseException:
        self.txn.waiting_request = None
        self._rollback()
        return error

    def _rollback(self) -> None:
        """Give back what this call acquired, newest first."""
        txn = self.txn
        mgr = txn._mgr
        for req, before in reversed(self.undo):
            queue = req.in_queue
            if before is None:
                queue.remove_granted(req)
                txn._forget(req, granted=True)
            else:
                queue.add_granted(req, before)
            mgr._wake_granted(queue)
        self.undo.clear()

    def _timeout(self, req: Request, mode: Mode) -> LockTimeout:
        queue = req.in_queue
        blockers = tuple(_blocker_ids(queue, req, mode))
        what = "metadata lock" if queue.kind == "metadata" else "lock"
        tried = "a try" if self.limit == 0 else f"{self.limit:g} s"
        return LockTimeout(
            f"txn {self.txn.id} could not get {what} {mode.value} on {queue.key!r} "
            f"({tried}); blocked by txn {', '.join(map(str, blockers))}",
            resource=queue.key,
            mode=mode,
            timeout=self.limit,
            blockers=blockers,
        )

    def _check_deadlock(self, req: Request) -> None:
        """Search for a cycle through this new wait; refuse victims until there is none (L7)."""
        txn = self.txn
        mgr = txn._mgr
        while req.wanted is not None:
            found = find_cycle(txn, mgr.deadlock_max_steps, mgr.deadlock_max_depth)
            if found is None:
                return
            path, complete = found
            victim = _choose_victim(mgr.victim, path) if complete else txn
            mgr._deadlocks += 1
            error = _deadlock_error(victim, path, complete)
            victim_req = victim.waiting_request
            assert victim_req is not None
            mgr._refuse(victim_req)
            if victim is txn:
                raise self._failed(error)
            victim_req.failure = error
            mgr._wakes.append(victim_req)


def _maybe_escalate(txn: Txn, parent: Request, parent_key: Resource) -> None:
    """Escalate a parent of rows holding more than the threshold (L10), retrying now and then."""
    if len(parent_key) == txn._mgr._depth - 1 and parent.children >= txn._escalate_at.get(
        id(parent), 0
    ):
        _escalate(txn, parent, parent_key)


def _escalate(txn: Txn, parent: Request, parent_key: Resource) -> None:
    """Try (never wait) to replace the rows under `parent` by one S or X lock on it."""
    mgr = txn._mgr
    assert parent.mode is not None
    queue = parent.queue or mgr._queue(parent_key)  # a solo parent gets its queue now
    rows = [(key, row) for key, row in txn._locks.items() if row.parent is parent]
    target = parent.mode.join(Mode.X if any(row.mode is Mode.X for _, row in rows) else Mode.S)
    if queue.blocked_on_arrival(parent, target):
        txn._escalate_at[id(parent)] = parent.children + mgr.escalation_retry
        return
    queue.add_granted(parent, target)
    mgr._escalations += 1
    for key, row in rows:
        del txn._locks[key]
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
        return min(cycle, key=lambda t: (len(t._locks) + len(t._meta), -t.id))
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
        f"txn {victim.id} refused {req.wanted.value} on {req.in_queue.key!r}: {reason}; "
        f"release its locks (or retry the transaction) to let the others through",
        resource=req.in_queue.key,
        mode=req.wanted,
        cycle=cycle,
    )


def _blocker_ids(queue: Queue, req: Request, mode: Mode) -> list[int]:
    if req.wanted is not None:
        return [r.owner.id for r in queue.blockers(req)]
    # Not queued (a failed try): everyone it would have waited for.
    owner = req.owner
    ids = [
        r.owner.id
        for r in queue.granted.values()
        if r.owner is not owner and queue.blocks(r.mode, mode)  # type: ignore[arg-type]
    ]
    ids += [
        r.owner.id
        for r in queue.waiting[: queue.position_for(req, mode)]
        if r.owner is not owner and queue.blocks(r.wanted, mode)  # type: ignore[arg-type]
    ]
    return ids


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _as_mode(mode: Mode | str) -> Mode:
    return mode if mode.__class__ is Mode else Mode.parse(mode)


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
