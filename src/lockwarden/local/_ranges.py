"""Range locks on ordered keys, InnoDB style: the index, the steps of a scan and of an insert,
and how locks move when the index changes (README.md, "Range locks").

An `Index` is an ordered set of keys with a `SUPREMUM` above them all. The
queues, the grant walk, timeouts, the deadlock search and the undo of a
failed call are the manager's own; range modes are in ``_range_modes.py``
and the key's queue in ``_range_queue.py``. What this module adds is what
depends on the order of keys: which keys a scan locks, where an insert asks,
and the two ways locks move between keys when the index changes: an insert
splits a gap, a removal merges two.

It reaches an owner only through `Owner` (``_queue.py``): its books of range
locks, and the undo of its call in progress, which a move rewrites.

Everything that touches the lock table runs under the manager's mutex.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

from lockwarden.errors import LockUsageError
from lockwarden.local._kinds import RANGE, Step
from lockwarden.local._queue import Owner, Request
from lockwarden.local._range_modes import (
    GAP,
    INSERT_INTENTION,
    X_NEXT_KEY,
    X_RECORD,
    Kind,
    RangeMode,
    join,
)
from lockwarden.local._range_queue import RangeQueue
from lockwarden.local._table import LockTable
from lockwarden.modes import Mode

__all__ = ["SUPREMUM", "Index"]

_Bisect = Callable[[list[Any], Any], int]


class _Supremum:
    """The key above every key of every index; its gap is the one after the last key.

    It compares greater than anything else, so ``key <= hi`` and friends need
    no special case. It is not a record: it has no record part to lock.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "SUPREMUM"

    def __reduce__(self) -> str:
        return "SUPREMUM"

    def __lt__(self, other: object) -> bool:
        return False

    def __le__(self, other: object) -> bool:
        return other is self

    def __gt__(self, other: object) -> bool:
        return other is not self

    def __ge__(self, other: object) -> bool:
        return True


SUPREMUM = _Supremum()


class _Inserting:
    """An insert in progress, known to the index so that the grant itself can insert."""

    __slots__ = ("done", "holder", "key")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.done = False
        self.holder: Request[RangeMode] | None = None
        """The request whose insert intention was granted last, to give back."""


class Index:
    """An ordered set of keys that transactions lock, made by `LockManager.index`.

    Keys are hashable and mutually comparable (numbers with numbers, strings
    with strings, tuples of such…). Reading it (`in`, `len`, `keys`,
    `next_key`) takes a snapshot under the manager's mutex. Keys enter with
    `Txn.insert` (which locks) and leave with `remove` (which does not).
    """

    __slots__ = ("_inserts", "_keys", "_mgr", "name", "table")

    def __init__(
        self,
        manager: LockTable,
        name: str,
        table: tuple[Hashable, ...] | None,
        keys: Iterable[Any],
    ) -> None:
        self._mgr = manager
        self.name = name
        self.table = table
        """The resource whose intention lock each range lock on this index takes first (or None)."""
        self._inserts: dict[int, _Inserting] = {}
        """The inserts in progress into this index, by owner id (an owner makes one at a time)."""
        self._keys: list[Any] = []
        for key in keys:
            if key is SUPREMUM:
                raise LockUsageError("the supremum is not a key: it is above every key already")
            pos = self._position(key)
            if not self._at(pos, key):
                self._keys.insert(pos, key)

    def __repr__(self) -> str:
        return f"<Index {self.name!r}: {len(self._keys)} keys>"

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        with self._mgr._mutex:
            return self._has(key)

    def keys(self, lo: Any = None, hi: Any = None) -> list[Any]:
        """The keys from `lo` to `hi`, both included (None: unbounded), in order."""
        with self._mgr._mutex:
            start = 0 if lo is None else self._position(lo)
            end = len(self._keys) if hi is None else self._position(hi, bisect.bisect_right)
            return self._keys[start:end]

    def next_key(self, key: Any) -> Any:
        """The first key above `key`, or `SUPREMUM`: the key whose gap `key` falls in."""
        with self._mgr._mutex:
            return self._after(key)

    def remove(self, key: Any) -> None:
        """Take `key` out of the index; every lock on it moves to the next key as a gap lock.

        This is what purge does once the transaction that deleted the record
        has committed, or what undo does for an aborted insert: it takes no
        lock and never waits. The caller makes sure nobody still needs the
        record (usually by holding an X lock on it until now). Waiting
        requests move too and are re-examined there; see README.md,
        "Range locks", for why an insert intention stays one.
        """
        mgr = self._mgr
        with mgr._critical:
            pos = self._position(key)
            if not self._at(pos, key):
                raise LockUsageError(
                    f"key {key!r} is not in index {self.name!r}; only keys that are there "
                    f"can be removed"
                )
            del self._keys[pos]
            queue = mgr._range_queues.pop((self, key), None)
            if queue is not None:
                _hand_over(mgr, queue, (self, self._key_at(pos)))

    # -- under the mutex ---------------------------------------------------------

    def _intention_granted(self, req: Request[RangeMode], key: Any) -> None:
        """An insert intention on `key` was granted: an insert in progress goes in at once."""
        job = self._inserts.get(req.owner.id)
        if job is not None:
            job.holder = req
            job.done = _try_insert(self._mgr, req.owner, self, job.key, key)

    def _position(self, key: Any, find: _Bisect = bisect.bisect_left) -> int:
        """Where `key` is or would go (`find`: bisect_right for just after it).

        LockUsageError if it cannot be a key of this index.
        """
        if key is SUPREMUM:
            return len(self._keys)
        try:
            hash(key)
            return find(self._keys, key)
        except TypeError:
            example = f" such as {self._keys[0]!r}" if self._keys else ""
            raise LockUsageError(
                f"{key!r} cannot be a key of index {self.name!r}: keys must be hashable and "
                f"comparable with each other (this index holds keys{example})"
            ) from None

    def _key_at(self, pos: int) -> Any:
        """The key at `pos`, or SUPREMUM past the last one."""
        return self._keys[pos] if pos < len(self._keys) else SUPREMUM

    def _add(self, key: Any) -> None:
        self._keys.insert(self._absent(key), key)

    def _absent(self, key: Any) -> int:
        """Where `key` would go; LockUsageError if it is there already."""
        pos = self._position(key)
        if self._at(pos, key):
            raise LockUsageError(f"key {key!r} is already in index {self.name!r}")
        return pos

    def _at(self, pos: int, key: Any) -> bool:
        return pos < len(self._keys) and self._keys[pos] == key

    def _has(self, key: Any) -> bool:
        return self._at(self._position(key), key)

    def _after(self, key: Any) -> Any:
        """The first key above `key`, or SUPREMUM."""
        return self._key_at(self._position(key, bisect.bisect_right))


# -- lock calls: their steps, generated as the index is at each step ------------------


def scan_steps(index: Index, lo: Any, hi: Any, mode: Mode) -> Iterator[Step]:
    """Next-key locks on every key from `lo` to `hi`, then a gap lock on the next key.

    Each step is taken when the one before it is granted, which may be after
    a wait during which keys came and went. So after every grant the walk
    looks at the index again: if a key was inserted below the one just
    locked (it could be, until that lock was granted), it is locked next;
    from then on, no key can enter the range without waiting for us.
    """
    next_key_mode = RangeMode.of(Kind.NEXT_KEY, mode)
    # The keys locked and confirmed so far are those from lo to `done`.
    done, find = lo, bisect.bisect_left  # (none yet: from lo itself)
    key = index._key_at(index._position(lo))
    while True:
        last = key is SUPREMUM or hi < key
        yield RANGE, (index, key), GAP if last else next_key_mode
        pos = index._position(done, find)
        found = index._key_at(pos)
        if found != key:
            key = found
            continue
        if last:
            return
        done, find = key, bisect.bisect_right
        key = index._key_at(pos + 1)


def insert_steps(table: LockTable, owner: Owner, index: Index, key: Any) -> Iterator[Step]:
    """Insert intention on the next key, then the key goes in and the gap splits.

    The key goes in the moment the intention is granted, under the same
    hold of the mutex (`Index._intention_granted`), while no other owner's
    gap lock is on the next key. Were it left to the inserting thread, a gap
    lock could be granted in between (gap locks wait for no intention) and
    send the insert back to wait — again and again, for a transaction that
    retries faster than the inserter wakes up. If the gap changed while the
    call waited, the grant does not insert, and the call asks again on the
    key above it now.

    Each time, the intention is given back: it protects nothing, and kept it
    would make a later request of this owner on that key wait for gap locks
    (and a new one could not wait: it would be covered). An intention the
    owner held on that key before the call is the insert's as well: given
    back, and not restored if the call fails.

    The call closes this generator when it fails, which ends the insert's
    registration with the index.
    """
    job = index._inserts[owner.id] = _Inserting(key)
    books = owner._books(RANGE)
    try:
        while True:
            index._absent(key)
            heir = index._after(key)
            yield RANGE, (index, heir), INSERT_INTENTION
            holder = job.holder or books.get((index, heir))
            if not job.done:  # it held the intention already: no grant, so no insert yet
                job.done = _try_insert(table, owner, index, key, heir)
            if holder is not None and holder.mode is not None and holder.mode.insert_intention:
                _give_back_intention(table, owner, holder)
            job.holder = None
            if job.done:
                return
    finally:
        del index._inserts[owner.id]


def _give_back_intention(table: LockTable, owner: Owner, req: Request[RangeMode]) -> None:
    """Drop the insert intention from `req`, and from what the call's undo would restore."""
    undo = owner._undo
    assert undo is not None and req.mode is not None
    before = undo.get(req)
    if before is not None:
        undo[req] = before.without_insert_intention
    table._set_held(req, req.mode.without_insert_intention)


def _try_insert(table: LockTable, owner: Owner, index: Index, key: Any, heir: Any) -> bool:
    """Insert `key` if the owner's intention on `heir` lets it now; whether it did.

    It does when `heir` is still the key above `key` and no other owner
    holds a gap lock there.
    """
    req = owner._books(RANGE).get((index, heir))
    fits = (
        req is not None
        and req.mode is not None
        and req.mode.insert_intention
        and index._after(key) == heir
        and not index._has(key)
        and not req.in_queue.blocked_by_granted(req, INSERT_INTENTION)
    )
    if fits:
        _split(table, owner, index, key, heir)
    return fits


def _split(table: LockTable, owner: Owner, index: Index, key: Any, heir: Any) -> None:
    """`key` goes in below `heir`, splitting its gap in two; the inserter gets X on `key`.

    Gap locks on `heir` are copied to `key`, since each half of the old gap
    is now a gap of its own. The only ones there belong to the inserter: any
    other owner's would have failed the check `_try_insert` just made. So
    the copy is the inserter's: a next-key X lock on `key` if it held the
    gap, else an X record lock — the explicit form of what InnoDB keeps
    implicit in the record (nobody reads or locks the new key before the
    inserter ends).
    """
    index._add(key)
    mine = owner._books(RANGE).get((index, heir))
    held_gap = mine is not None and mine.mode is not None and mine.mode.gap
    req: Request[RangeMode] = Request(owner, table._range_queue((index, key)), None, None)
    req.in_queue.add_granted(req, X_NEXT_KEY if held_gap else X_RECORD)
    table._book(req)
    table._grants += 1


# -- a removal merges two gaps -----------------------------------------------------


def _hand_over(table: LockTable, queue: RangeQueue, heir_key: tuple[Index, Any]) -> None:
    """Move every request of a removed key's queue to the next key, then re-examine it.

    Granted requests go over first, then waiting ones in their order, to
    the back of the next key's queue (no request goes ahead of one
    already waiting there). An owner that already has a request on the next
    key ends up with one request. Inherited gap locks can make waiters
    of the next key wait for owners that are themselves waiting, without
    anyone starting a new wait, so the deadlock search runs for each waiter
    left there.
    """
    heir = table._range_queue(heir_key)
    granted_only = [req for req in queue.granted.values() if req.wanted is None]
    for req in [*granted_only, *queue.waiting]:
        _move(heir, req, queue.key)
    table._wake_granted(heir)
    for req in list(heir.waiting):
        if req.wanted is not None:
            error = table._resolve_deadlocks(req.owner)
            if error is not None:
                req.failure = error
                table._wakes.append(req)


def _move(heir: RangeQueue, req: Request[RangeMode], removed: tuple[Any, Any]) -> None:
    """Move one owner's request from the removed key to the heir queue, merging it with one
    it has there."""
    owner = req.owner
    books = owner._books(RANGE)
    del books[removed]
    other = books.get(heir.key)
    held_before = req.mode
    other_before = other.mode if other is not None else None
    held = join(held_before.handed_on if held_before is not None else None, other_before)
    wanted = req.wanted.handed_on_waiting if req.wanted is not None else None
    parent = req.parent or (other.parent if other is not None else None)
    counted = (req.parent is not None) + (other is not None and other.parent is not None)

    survivor: Request[RangeMode] | None
    if wanted is None and other is not None:
        # `other` stays where it is in the heir's queue, waiting or not.
        survivor = other
        heir.set_granted(other, held)
        if other.wanted is not None and held is not None:
            heir.set_wanted(other, other.wanted.join(held))
        req.mode = None  # absorbed
    else:
        # `req` moves; if its owner waits on it, it keeps its gate.
        if other is not None:
            assert other.wanted is None, "an owner waits for one request at a time"
            heir.set_granted(other, None)
        survivor = req if held is not None or wanted is not None else None
        req.queue, req.mode, req.wanted = heir, None, None
        heir.set_granted(req, held)
        if wanted is not None:
            heir.append_waiting(req, join(wanted, held))  # type: ignore[arg-type]
    req.parent = None
    if survivor is not None:
        books[heir.key] = survivor
        survivor.parent = parent if survivor.mode is not None else None
    if parent is not None:
        parent.children += (survivor is not None and survivor.mode is not None) - counted

    undo = owner._undo
    if undo is not None and (req in undo or other in undo):
        # What the owner would hold on the heir had the call never run: the
        # same hand-over applied to what it held before the call.
        before = undo.pop(req, held_before)
        before_other = undo.pop(other, other_before) if other is not None else None
        if survivor is not None:
            undo[survivor] = join(before.handed_on if before is not None else None, before_other)
