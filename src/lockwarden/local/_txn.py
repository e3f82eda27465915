"""The transaction: an owner of locks, what it holds, and the lock calls it makes.

A `Txn` keeps its requests in one dict per lock table (its books), at most
one request per key. It is the one implementation of `Owner` (``_queue.py``),
the narrow interface through which the rest of the manager sees it.

Its calls plan their steps root to leaf here (the hierarchy rule: README.md,
"Hierarchy"), then hand them to a `Call` (``_call.py``), which takes them
under the mutex and waits when it must. The uncontended row lock does not go
through a call at all: `Txn.lock` grants it inline (README.md, "Solo locks").
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Generator, Hashable, Iterator
from typing import Any, TypeVar

from lockwarden.errors import LockUsageError, NotHeld
from lockwarden.local._call import Call
from lockwarden.local._escalation import maybe_escalate
from lockwarden.local._kinds import DATA, METADATA, RANGE, Step, Table
from lockwarden.local._queue import Owner, Queue, Request
from lockwarden.local._range_modes import Kind, RangeMode
from lockwarden.local._ranges import SUPREMUM, Index, insert_steps, scan_steps
from lockwarden.local._settings import DEFAULT, Timeout
from lockwarden.local._table import LockTable
from lockwarden.modes import Mode

__all__ = ["Txn"]

Resource = tuple[Hashable, ...]
T = TypeVar("T")

_NOTHING = object()
"""Equal to no part of a resource."""
_IS, _S, _X = Mode.IS, Mode.S, Mode.X  # plain globals, as DATA and friends in _kinds.py
_INTENTIONS = frozenset((Mode.IS, Mode.IX))
_ROW_MODES = frozenset((Mode.S, Mode.X))
# Parent modes under which a child lock needs nothing more on the parent and
# is not already implied by it: IS or IX under a reader, IX under a writer.
_FAST_PARENTS = {
    mode: frozenset((Mode.IS, Mode.IX) if mode.parent_intention is Mode.IS else (Mode.IX,))
    for mode in Mode
}


class Txn:
    """An owner of locks: a transaction, in database terms.

    One txn waits for at most one request at a time; use one txn per thread
    or task of control. ``with mgr.begin() as txn:`` releases everything on exit.
    """

    __slots__ = (
        "_escalate_at",
        "_hot",
        "_hot_head",
        "_hot_held",
        "_hot_mode",
        "_locks",
        "_meta",
        "_mgr",
        "_ranges",
        "_spare",
        "_undo",
        "_waiting",
        "_waits_for",
        "_waits_mark",
        "id",
        "name",
    )

    def __init__(self, manager: LockTable, txn_id: int, name: str | None) -> None:
        self._mgr = manager
        self.id = txn_id
        self.name = name
        self._locks: dict[Resource, Request[Mode]] = {}
        """Data locks, granted or queued: one request per resource."""
        self._meta: dict[Hashable, Request[Mode]] = {}
        """Metadata locks, by table."""
        self._ranges: dict[tuple[Index, Hashable], Request[RangeMode]] = {}
        """Range locks, by (index, key)."""
        self._waiting: Request[Any] | None = None
        self._undo: dict[Request[Any], Any] | None = None
        self._escalate_at: dict[int, int] = {}
        self._waits_for: tuple[Owner, ...] | None = None
        self._waits_mark: object = None
        self._hot: Request[Mode] | None = None
        """The parent request of the last two-part resource locked on the uncontended path; its
        mode is None once it is released (as is any request that leaves its queue)."""
        self._hot_head: Hashable = _NOTHING
        """The first part of the resources `_hot` is the parent of."""
        self._hot_mode: Mode | None = None
        """The mode `_hot` was found good for: a lock in another mode asks again."""
        self._hot_held: Mode | None = None
        """`_hot`'s mode when it was found good: any change to it (a release, an upgrade, an
        escalation) makes the next lock ask again."""
        self._spare: Request[Mode] | None = None
        """A request left by the last solo unlock, for the next solo lock (no allocation)."""

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<Txn {self.id}{label}: {self._count()} locks>"

    def _count(self) -> int:
        return len(self._locks) + len(self._meta) + len(self._ranges)

    def _books(self, table: Table) -> dict[Any, Request[Any]]:
        if table is DATA:
            return self._locks
        return self._meta if table is METADATA else self._ranges

    def __enter__(self) -> Txn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_all()

    # -- acquiring ---------------------------------------------------------------

    def lock(self, resource: Resource, mode: Mode | str, timeout: Timeout = DEFAULT) -> Mode:
        """Lock `resource` in `mode`, waiting at most `timeout` seconds.

        `timeout` omitted: the manager's default for the lock's class; None:
        no limit of the call's own (the manager's maximum still applies); 0:
        try once (docs/contract.md). Ancestors get the intention locks they
        need first, root to leaf (unless the manager is strict). Returns the
        mode now held, which is stronger than `mode` when the txn already
        held something else. Raises `LockTimeout` or `Deadlock`; either way
        the txn holds exactly what it held before the call.
        """
        mgr = self._mgr
        if timeout is DEFAULT:
            # The uncontended case, inline: the general path below specialised
            # to a resource nobody has locked, under a parent that already
            # holds the intention mode it needs. Same rule; no plan, no call,
            # no clock read, and the lock is a solo lock (README.md, "Solo
            # locks") in a request kept from the last solo unlock if there is one.
            mgr._mutex.acquire()
            try:
                parent = self._hot
                if (
                    resource.__class__ is not tuple
                    or len(resource) != 2
                    or resource[0] != self._hot_head
                    or mode is not self._hot_mode
                    or parent.mode is not self._hot_held  # type: ignore[union-attr]
                ):
                    parent = self._solo_parent(resource, mode)
                if parent is not None and self._waiting is None:
                    # `mode` is a Mode here: `_hot_mode` is one, and `_solo_parent` checks.
                    req = self._spare
                    if req is None:
                        req = Request(self, None, mode, None, parent, stamped=False)  # type: ignore[arg-type]
                    else:
                        req.mode, req.parent = mode, parent  # type: ignore[assignment]
                    if mgr._queues.setdefault(resource, req) is req:  # nobody had it
                        self._spare = None
                        self._locks[resource] = req
                        parent.children += 1
                        mgr._grants += 1
                        if parent.children > mgr._escalation_floor:
                            maybe_escalate(mgr, self, parent, resource[:-1])
                        return mode  # type: ignore[return-value]
            except TypeError:
                pass  # an unhashable part: the general path says so
            finally:
                if mgr._wakes:  # only after an escalation
                    mgr._leave()
                else:
                    mgr._mutex.release()
        call = self._start(resource, _as_mode(mode), timeout, None)
        return call if isinstance(call, Mode) else call.wait()

    def _solo_parent(self, resource: Resource, mode: Mode | str) -> Request[Mode] | None:
        """The request under which `resource` can be locked in `mode` as a solo lock, or None.

        That is the txn's granted request on the parent, if its mode is the
        intention `mode` needs there and implies nothing on the children:
        the ancestors above it are then held too (README.md, "Hierarchy").
        For a two-part resource the answer is remembered with what it
        depends on (`_hot`), so the next lock of a row of the same table in
        the same mode checks four identities instead of asking again.
        """
        if type(mode) is not Mode or type(resource) is not tuple:
            return None
        n = len(resource)
        if n < 2 or (n >= self._mgr._depth and mode not in _ROW_MODES):
            return None
        parent = self._locks.get(resource[:-1])
        if parent is None or parent.mode not in _FAST_PARENTS[mode]:
            return None
        if n == 2:
            self._hot, self._hot_head, self._hot_mode = parent, resource[0], mode
            self._hot_held = parent.mode
        return parent

    async def lock_async(
        self, resource: Resource, mode: Mode | str, timeout: Timeout = DEFAULT
    ) -> Mode:
        """`lock` for asyncio: a wait suspends the task, not a thread.

        Cancelling the task removes its request and undoes whatever the call
        had acquired, then re-raises `asyncio.CancelledError`.
        """
        call = self._start(resource, _as_mode(mode), timeout, asyncio.get_running_loop())
        return call if isinstance(call, Mode) else await call.wait_async()

    def lock_metadata(self, table: Hashable, mode: Mode | str, timeout: Timeout = DEFAULT) -> Mode:
        """Take the metadata lock of `table`: S to use the table, X to change its definition.

        Needs a manager created with ``metadata_locks=True``. S is taken
        automatically before the first data lock on a table (unless strict);
        X waits like a table lock (``ddl_wait_timeout``), S like a row lock.
        """
        mode = _as_mode(mode)
        mgr = self._mgr
        if not mgr._settings.metadata_locks:
            raise LockUsageError(
                "metadata locks are off for this manager; create it with metadata_locks=True"
            )
        if mode not in _ROW_MODES:
            raise LockUsageError(f"a metadata lock is S (use) or X (DDL), not {mode.value}")
        limit = mgr._settings.limit(mode is Mode.X, timeout)
        try:
            hash(table)
        except TypeError:
            raise LockUsageError(f"a table name must be hashable: {table!r}") from None
        with mgr._critical:
            self._check_not_waiting()
            call = Call(mgr, self, iter([(METADATA, table, mode)]), limit, None)
        held: Mode = call.wait()
        return held

    # -- range locks (_ranges.py) ------------------------------------------------------

    def lock_key(
        self,
        index: Index,
        key: Any,
        kind: Kind | str,
        mode: Mode | str,
        timeout: Timeout = DEFAULT,
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
        return call if isinstance(call, RangeMode) else call.wait()

    async def lock_key_async(
        self,
        index: Index,
        key: Any,
        kind: Kind | str,
        mode: Mode | str,
        timeout: Timeout = DEFAULT,
    ) -> RangeMode:
        """`lock_key` for asyncio: a wait suspends the task; cancelling it withdraws the request."""
        loop = asyncio.get_running_loop()
        call = self._key_call(index, key, kind, mode, timeout=timeout, loop=loop)
        return call if isinstance(call, RangeMode) else await call.wait_async()

    def lock_range(
        self, index: Index, lo: Any, hi: Any, mode: Mode | str, timeout: Timeout = DEFAULT
    ) -> list[Any]:
        """Lock the keys from `lo` to `hi` and every gap between them against inserts.

        Takes a next-key lock on each key of the index in ``[lo, hi]`` and a
        gap lock on the first key above `hi` (or the supremum), so no key can
        enter the range until this txn releases. ``hi=SUPREMUM`` runs to the
        end. Returns the keys in the range, which stay as they are while the
        locks are held (unless `Index.remove` is called regardless of locks).
        """
        call = self._range_call(index, lo, hi, mode, timeout=timeout, loop=None)
        if isinstance(call, Call):
            call.wait()
        return index.keys(lo, hi)

    async def lock_range_async(
        self, index: Index, lo: Any, hi: Any, mode: Mode | str, timeout: Timeout = DEFAULT
    ) -> list[Any]:
        """`lock_range` for asyncio."""
        loop = asyncio.get_running_loop()
        call = self._range_call(index, lo, hi, mode, timeout=timeout, loop=loop)
        if isinstance(call, Call):
            await call.wait_async()
        return index.keys(lo, hi)

    def insert(self, index: Index, key: Any, timeout: Timeout = DEFAULT) -> None:
        """Put `key` into `index` the way InnoDB inserts a record.

        Waits until no other owner holds a gap lock on the next key (an
        insert intention), then adds the key; gap locks on the next key are
        copied to it, since its gap was split in two. The txn then holds an
        X record lock on the new key (what InnoDB keeps implicit), so nobody
        reads or locks it before this txn ends. Raises `LockUsageError` if the
        key is there already (also if it arrived while this call waited);
        `LockTimeout` or `Deadlock` like any lock call. The intention is given
        back when the insert is done or fails — one this txn took itself on
        that key beforehand too (README.md, "Range locks").
        """
        call = self._insert_call(index, key, timeout=timeout, loop=None)
        if isinstance(call, Call):
            call.wait()

    async def insert_async(self, index: Index, key: Any, timeout: Timeout = DEFAULT) -> None:
        """`insert` for asyncio."""
        loop = asyncio.get_running_loop()
        call = self._insert_call(index, key, timeout=timeout, loop=loop)
        if isinstance(call, Call):
            await call.wait_async()

    def _key_call(
        self,
        index: Index,
        key: Any,
        kind: Kind | str,
        mode: Mode | str,
        *,
        timeout: Timeout,
        loop: asyncio.AbstractEventLoop | None,
    ) -> Call | RangeMode:
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
            steps = self._plan(RANGE, (index, key), wanted, *self._above(index))
            return wanted if isinstance(steps, Mode) else steps  # covered by a table lock

        return self._call_with(plan, self._range_limit(index, timeout), loop)

    def _range_call(
        self,
        index: Index,
        lo: Any,
        hi: Any,
        mode: Mode | str,
        *,
        timeout: Timeout,
        loop: asyncio.AbstractEventLoop | None,
    ) -> Call | Mode:
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
        timeout: Timeout,
        loop: asyncio.AbstractEventLoop | None,
    ) -> Call | Mode:
        if key is SUPREMUM:
            raise LockUsageError("the supremum is not a key: it cannot be inserted")
        intention = RangeMode.of(Kind.INSERT_INTENTION, Mode.X)

        def plan() -> Iterator[Step] | Mode:
            index._absent(key)
            above = self._ancestor_steps(index.name, intention, *self._above(index))
            if not isinstance(above, list):  # X on the table: nobody else can be in the way
                index._add(key)
                return above
            return _then(above, insert_steps(self._mgr, self, index, key))

        return self._call_with(plan, self._range_limit(index, timeout), loop)

    def _range_limit(self, index: Index, timeout: Timeout) -> float:
        """The time limit of a range call (range locks are row locks); checks the index first."""
        if not isinstance(index, Index) or index._mgr is not self._mgr:
            raise LockUsageError(
                f"{index!r} is not an index of this txn's manager: get one with mgr.index(name)"
            )
        return self._mgr._settings.limit(False, timeout)

    def unlock_key(self, index: Index, key: Any) -> None:
        """Release this txn's range lock on `key` of `index` (before the txn ends: not 2PL).

        `NotHeld` if it holds none there.
        """
        with self._mgr._critical:
            req = self._ranges.get((index, key))
            if req is None or req.mode is None:
                raise NotHeld(
                    f"txn {self.id} holds no range lock on {key!r} of index {index.name!r}",
                    name=(index.name, key),
                )
            self._check_not_upgrading(req, (index.name, key))
            self._mgr._drop(req)

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
        return table, table[0] if self._mgr._settings.metadata_locks else None

    def _start(
        self,
        resource: Resource,
        mode: Mode,
        timeout: Timeout,
        loop: asyncio.AbstractEventLoop | None,
    ) -> Call | Mode:
        """Check the call, then plan it and take every step that need not wait."""
        mgr = self._mgr
        _check_resource(mgr, resource, mode)
        coarse = mode not in _INTENTIONS and len(resource) < mgr._depth
        table = resource[0] if mgr._settings.metadata_locks else None
        return self._call_with(
            lambda: self._plan(DATA, resource, mode, resource[:-1], table),
            mgr._settings.limit(coarse, timeout),
            loop,
        )

    def _call_with(
        self,
        plan: Callable[[], Iterator[Step] | T],
        limit: float,
        loop: asyncio.AbstractEventLoop | None,
    ) -> Call | T:
        """Plan a call under the mutex and take every step that need not wait.

        `plan` returns the steps, or the call's result when there is nothing
        to lock. The call's `first` is the request it waits for (None: done).
        """
        with self._mgr._critical:
            self._check_not_waiting()
            steps = plan()
            if not isinstance(steps, Iterator):
                return steps
            return Call(self._mgr, self, steps, limit, loop)

    def _check_not_waiting(self) -> None:
        if self._waiting is not None:
            raise LockUsageError(
                f"txn {self.id} is already waiting for a lock (in another thread or task); "
                f"use one txn per thread of control"
            )

    def _plan(
        self, table: Table, key: Hashable, mode: Any, above: Resource, meta: Hashable | None
    ) -> Iterator[Step] | Any:
        """The steps of a lock call on one key, root to leaf; or the mode held if that covers it."""
        mine = self._books(table).get(key)
        if mine is not None and mine.mode is not None and mine.mode.covers(mode):
            return mine.mode
        steps = self._ancestor_steps(key, mode, above, meta)
        if not isinstance(steps, list):
            return steps
        steps.append((table, key, mode))
        return iter(steps)

    def _ancestor_steps(
        self, what: object, mode: Any, above: Resource, meta: Hashable | None
    ) -> list[Step] | Mode:
        """The locks needed above `what` before it is locked in `mode`, root to leaf.

        `above` is the path of its parent (every prefix is an ancestor) and
        `meta` the table whose metadata lock comes first, if metadata locks
        are on. Returns the mode an ancestor's lock implies on `what`
        instead, when that covers `mode` (README.md, "Hierarchy").
        """
        strict = self._mgr._settings.strict
        steps: list[Step] = []
        if meta is not None and meta not in self._meta:
            if strict:
                raise LockUsageError(
                    f"strict mode: take the metadata lock of {meta!r} "
                    f"(txn.lock_metadata(..., Mode.S)) before locking {what!r}"
                )
            steps.append((METADATA, meta, _S))
        need = mode.parent_intention
        for depth in range(1, len(above) + 1):
            ancestor = above[:depth]
            held = self._locks.get(ancestor)
            held_mode = held.mode if held is not None else None
            if held_mode is not None:
                implied = held_mode.implied_on_descendants
                # S on an ancestor implies every read below it, X everything.
                if implied is _X or (implied is _S and need is _IS):
                    return implied
                if held_mode.covers(need):
                    continue
            if strict:
                raise LockUsageError(
                    f"strict mode: lock {ancestor!r} in {need.value} or stronger "
                    f"before locking {what!r} in {mode.value}"
                )
            steps.append((DATA, ancestor, need))
        return steps

    # -- releasing ---------------------------------------------------------------

    def unlock(self, resource: Resource) -> None:
        """Release the lock on `resource`. Its children must be released first.

        `NotHeld` if the txn holds no lock of its own on `resource` (one its
        lock on an ancestor implies included: unlock the ancestor).
        """
        mgr = self._mgr
        mgr._mutex.acquire()
        try:
            req = self._locks.pop(resource, None)  # one hash of the key, not two
            if req is not None:
                if req.queue is None and not req.children:  # a solo lock: nobody else to wake
                    del mgr._queues[resource]
                    req.parent.children -= 1  # type: ignore[union-attr]  # a solo lock has one
                    # Kept for the next solo lock. Nothing refers to it now: a
                    # solo request is in no queue, no call's undo and no cache.
                    req.since = None
                    self._spare = req
                    return
                self._locks[resource] = req  # back in the books (their order means nothing)
                if req.mode is not None and not req.children and req.wanted is None:
                    mgr._drop(req)
                    return
            self._why_not_unlockable(resource, req)
        finally:
            if mgr._wakes:
                mgr._leave()
            else:
                mgr._mutex.release()

    def _why_not_unlockable(self, resource: Resource, req: Request[Mode] | None) -> None:
        """Raise the error that says why `resource` cannot be unlocked."""
        if req is None or req.mode is None:
            for depth in range(1, len(resource) if type(resource) is tuple else 0):
                above = self._locks.get(resource[:depth])
                if (
                    above is not None
                    and above.mode is not None
                    and above.mode.implied_on_descendants
                ):
                    raise NotHeld(
                        f"txn {self.id} holds {resource!r} only through its {above.mode.value} "
                        f"lock on {resource[:depth]!r} (taken explicitly or by lock escalation); "
                        f"unlock {resource[:depth]!r} instead",
                        name=resource,
                    )
            raise NotHeld(f"txn {self.id} holds no lock on {resource!r}", name=resource)
        if req.children:
            raise LockUsageError(
                f"txn {self.id} still holds {req.children} lock(s) under {resource!r}; "
                f"unlock them first, or release_all()"
            )
        self._check_not_upgrading(req, resource)

    def _check_not_upgrading(self, req: Request[Any], what: object) -> None:
        if req.wanted is not None:
            raise LockUsageError(
                f"txn {self.id} is waiting to upgrade its lock on {what!r} "
                f"(in another thread or task); it cannot be released now"
            )

    def unlock_metadata(self, table: Hashable) -> None:
        """Release the metadata lock of `table`. Data locks on the table must be released first.

        `NotHeld` if the txn holds none on `table`.
        """
        with self._mgr._critical:
            req = self._meta.get(table)
            if req is None or req.mode is None:
                raise NotHeld(f"txn {self.id} holds no metadata lock on {table!r}", name=table)
            self._check_not_upgrading(req, table)
            if (table,) in self._locks:
                raise LockUsageError(
                    f"txn {self.id} still holds data locks on {table!r}; unlock them first"
                )
            self._mgr._drop(req)

    def release_all(self) -> None:
        """Release every lock this txn holds."""
        mgr = self._mgr
        with mgr._critical:
            if self._waiting is not None:
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


def _then(first: list[Step], rest: Iterator[Step]) -> Generator[Step]:
    """`first`, then `rest`, as a generator: closing it closes `rest` (``_call.py``)."""
    yield from first
    yield from rest


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


def _check_resource(mgr: LockTable, resource: object, mode: Mode) -> None:
    levels = mgr._settings.levels
    if type(resource) is not tuple or not 0 < len(resource) <= mgr._depth:
        raise LockUsageError(
            f"a resource is a tuple of 1 to {mgr._depth} parts ({', '.join(levels)}), "
            f"got {resource!r}"
        )
    if len(resource) == mgr._depth and mode not in _ROW_MODES:
        raise LockUsageError(
            f"a {levels[-1]} (the last level) is locked in S or X only, not {mode.value}: "
            f"intention modes announce locks on children, and it has none"
        )
    try:
        hash(resource)
    except TypeError:
        raise LockUsageError(f"every part of a resource must be hashable: {resource!r}") from None
