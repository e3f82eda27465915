"""Range locks on ordered keys, InnoDB style (DESIGN part R; README.md, "Range locks").

An `Index` is an ordered set of keys with a `SUPREMUM` above them all. A lock
on a key has a `Kind` — the record alone, the gap below the key, both
(next-key), or an insert intention — and a mode, S or X. What one owner holds
on one key is a single `RangeMode` (rule L3), so a second request on the key
is combined with the first through the same upgrade path as any lock.

The queues, the grant walk, timeouts, deadlock search and undo of a failed
call are the manager's own. This module adds what is particular to keys: the
modes and their one-way conflicts, the queue class that uses them, the index,
and the two ways locks move between keys when the index changes (R3): an
insert splits a gap, a removal merges two.

Everything that touches the lock table runs under the manager's mutex.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from lockwarden.errors import LockUsageError
from lockwarden.local._queue import Queue, Request
from lockwarden.modes import Mode

if TYPE_CHECKING:
    from lockwarden.local.manager import LockManager, Txn

__all__ = ["SUPREMUM", "Index", "Kind", "RangeMode"]

Step = tuple[str, Hashable, Any]
"""One step of a lock call: (queue kind, key in that lock table, mode)."""
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


class Kind(enum.Enum):
    """What part of a key a lock request covers (R1)."""

    RECORD = "record"
    """The record only: the key itself, not the gap below it."""
    GAP = "gap"
    """The open interval between the previous key and this one; keeps inserts out."""
    NEXT_KEY = "next-key"
    """The record and the gap below it: what a range scan takes on each key it passes."""
    INSERT_INTENTION = "insert-intention"
    """Announces an insert into the gap below this key; waits for others' gap locks."""


class RangeMode:
    """What one owner holds or wants on one key: a record part, a gap part, an insert intention.

    The record part is None, S or X; the other two are flags. A gap lock has
    no S or X of its own: gap locks never conflict with each other and only
    keep inserts out (R2), so a gap requested in S and one requested in X are
    the same lock. Two requests by one owner combine part by part (`join`).

    Conflicts run one way (``conflicts`` is the mask of the modes whose holders
    make a request for this one wait):

    - the record parts conflict as S and X do;
    - an insert intention waits for another owner's gap part (gap or next-key);
    - nothing else waits for anything: not a gap for a gap, nothing for an
      insert intention.
    """

    __slots__ = (
        "bit",
        "conflicts",
        "gap",
        "index",
        "insert_intention",
        "parent_intention",
        "record",
        "value",
    )

    record: Mode | None
    gap: bool
    insert_intention: bool
    index: int
    """Position among all range modes: lets a queue keep its counts in a list."""
    bit: int
    conflicts: int
    value: str
    """A readable name: "S next-key", "gap", "X record+insert-intention"."""
    parent_intention: Mode
    """What the index's table needs: IX to write or insert, IS to read or keep a gap."""

    def join(self, other: RangeMode, /) -> RangeMode:
        """The mode that gives both: each part the stronger of the two."""
        return _JOIN[self, other]

    def covers(self, other: RangeMode, /) -> bool:
        return _JOIN[self, other] is self

    @staticmethod
    def of(kind: Kind, mode: Mode) -> RangeMode:
        """The mode of a request of `kind` in `mode` (S or X) on an ordinary key."""
        record = mode if kind is Kind.RECORD or kind is Kind.NEXT_KEY else None
        gap = kind is Kind.GAP or kind is Kind.NEXT_KEY
        found = _parts(record, gap, kind is Kind.INSERT_INTENTION)
        assert found is not None
        return found

    @property
    def without_record(self) -> RangeMode | None:
        """This mode on the supremum, which has no record to lock: its gap and intention only."""
        return _parts(None, self.gap, self.insert_intention)

    @property
    def without_insert_intention(self) -> RangeMode | None:
        return _parts(self.record, self.gap, False)

    @property
    def handed_on(self) -> RangeMode | None:
        """What a granted lock on a removed key becomes on the next key (R3).

        Record and gap alike become a gap lock: the next key's gap now spans
        the removed record and its gap. A granted insert intention is
        dropped: it protects nothing, and carrying it over as granted would
        let an insert into the merged gap pass the next key's gap locks (the
        inserter asks again on the next key instead; see `insert_steps`).
        """
        return GAP if self.record is not None or self.gap else None

    @property
    def handed_on_waiting(self) -> RangeMode:
        """What a waiting request on a removed key waits for on the next key (R3).

        An insert intention stays one: the insert still has to wait for the
        gap locks of the gap it now falls in, which is the next key's. The
        rest becomes a gap lock, which waits for nothing.
        """
        found = _parts(None, self.record is not None or self.gap, self.insert_intention)
        assert found is not None
        return found

    def __repr__(self) -> str:
        return f"RangeMode({self.value!r})"


def _name(record: Mode | None, gap: bool, insert: bool) -> str:
    parts = []
    if record is not None:
        parts.append(f"{record.value} {'next-key' if gap else 'record'}")
    elif gap:
        parts.append("gap")
    if insert:
        parts.append("insert-intention")
    return "+".join(parts)


_RECORDS = (None, Mode.S, Mode.X)
_BY_PARTS: dict[tuple[Mode | None, bool, bool], RangeMode] = {}
for _record in _RECORDS:
    for _gap in (False, True):
        for _insert in (False, True):
            if _record is None and not _gap and not _insert:
                continue  # no lock at all
            _m = RangeMode.__new__(RangeMode)
            _m.record, _m.gap, _m.insert_intention = _record, _gap, _insert
            _m.index = len(_BY_PARTS)
            _m.bit = 1 << _m.index
            _m.value = _name(_record, _gap, _insert)
            _m.parent_intention = Mode.IX if _record is Mode.X or _insert else Mode.IS
            _BY_PARTS[_record, _gap, _insert] = _m
_ALL = tuple(_BY_PARTS.values())


def _parts(record: Mode | None, gap: bool, insert: bool) -> RangeMode | None:
    return _BY_PARTS.get((record, gap, insert))


def _waits_for(wanted: RangeMode, held: RangeMode) -> bool:
    """R2, between two owners: does a lock in `held` make a request for `wanted` wait?"""
    if (
        wanted.record is not None
        and held.record is not None
        and (wanted.record is Mode.X or held.record is Mode.X)
    ):
        return True
    return wanted.insert_intention and held.gap


for _m in _ALL:
    _m.conflicts = sum(h.bit for h in _ALL if _waits_for(_m, h))
_JOIN = {
    (a, b): _BY_PARTS[
        max(a.record, b.record, key=_RECORDS.index),
        a.gap or b.gap,
        a.insert_intention or b.insert_intention,
    ]
    for a in _ALL
    for b in _ALL
}

GAP = RangeMode.of(Kind.GAP, Mode.S)
INSERT_INTENTION = RangeMode.of(Kind.INSERT_INTENTION, Mode.X)
X_RECORD = RangeMode.of(Kind.RECORD, Mode.X)
X_NEXT_KEY = RangeMode.of(Kind.NEXT_KEY, Mode.X)


def _join(a: RangeMode | None, b: RangeMode | None) -> RangeMode | None:
    return b if a is None else a if b is None else a.join(b)


class RangeQueue(Queue[RangeMode]):
    """The locks on one key of an index. Its key in the lock table is ``(index, key)``.

    The grant rule and the walk are the base class's: with one-way
    ``conflicts`` masks they already apply R2, including "no request is
    queued ahead of a waiting one". What differs: no waiting mode blocks
    every other (a gap request waits for nothing), so the walk never stops
    early; and granting an insert's intention makes the insert.
    """

    __slots__ = ()

    key: tuple[Index, Any]
    kind = "range"
    width = len(_ALL)

    @property
    def resource(self) -> tuple[str, Any]:
        index, key = self.key
        return (index.name, key)

    @property
    def parent_key(self) -> Hashable | None:
        return self.key[0].table

    def _ahead_blocks_all(self, ahead: Any) -> bool:
        return False

    def granted_one(self, req: Request[RangeMode]) -> None:
        """An insert intention granted to an insert in progress inserts at once (`insert_steps`)."""
        call = req.owner._call
        job = call.inserting if call is not None else None
        if job is not None and self.key[0] is job.index:
            job.holder = req
            job.done = _try_insert(req.owner, job.index, job.key, self.key[1])


class Index:
    """An ordered set of keys that transactions lock, made by `LockManager.index`.

    Keys are hashable and mutually comparable (numbers with numbers, strings
    with strings, tuples of such…). Reading it (`in`, `len`, `keys`,
    `next_key`) takes a snapshot under the manager's mutex. Keys enter with
    `Txn.insert` (which locks) and leave with `remove` (which does not).
    """

    __slots__ = ("_keys", "_mgr", "name", "table")

    def __init__(
        self,
        manager: LockManager,
        name: str,
        table: tuple[Hashable, ...] | None,
        keys: Iterable[Any],
    ) -> None:
        self._mgr = manager
        self.name = name
        self.table = table
        """The resource whose intention lock each range lock on this index takes first (or None)."""
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
        """Take `key` out of the index; every lock on it moves to the next key as a gap lock (R3).

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
                heir = self._keys[pos] if pos < len(self._keys) else SUPREMUM
                _hand_over(mgr, queue, (self, heir))

    # -- under the mutex ---------------------------------------------------------

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
    """Next-key locks on every key from `lo` to `hi`, then a gap lock on the next key (R4).

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
        yield "range", (index, key), GAP if last else next_key_mode
        pos = index._position(done, find)
        found = index._key_at(pos)
        if found != key:
            key = found
            continue
        if last:
            return
        done, find = key, bisect.bisect_right
        key = index._key_at(pos + 1)


class Inserting:
    """An insert in progress, known to its call so that the grant itself can insert."""

    __slots__ = ("done", "holder", "index", "key")

    def __init__(self, index: Index, key: Any) -> None:
        self.index = index
        self.key = key
        self.done = False
        self.holder: Request[RangeMode] | None = None
        """The request whose insert intention was granted last, to give back."""


def insert_steps(txn: Txn, index: Index, key: Any) -> Iterator[Step]:
    """Insert intention on the next key, then the key goes in and the gap splits (R3).

    The key goes in the moment the intention is granted, under the same
    hold of the mutex (`RangeQueue.granted_one`), while no other owner's gap
    lock is on the next key. Were it left to the inserting thread, a gap
    lock could be granted in between (gap locks wait for no intention) and
    send the insert back to wait — again and again, for a transaction that
    retries faster than the inserter wakes up. If the gap changed while the
    call waited, the grant does not insert, and the call asks again on the
    key above it now.

    Each time, the intention is given back: it protects nothing, and kept it
    would make a later request of this owner on that key wait for gap locks
    (and a new one could not wait: it would be covered). An intention the
    txn held on that key before the call is the insert's as well: given
    back, and not restored if the call fails.
    """
    call = txn._call
    assert call is not None
    job = call.inserting = Inserting(index, key)
    while True:
        index._absent(key)
        heir = index._after(key)
        yield "range", (index, heir), INSERT_INTENTION
        holder = job.holder or txn._ranges.get((index, heir))
        if not job.done:  # it held the intention already: no grant, so no insert yet
            job.done = _try_insert(txn, index, key, heir)
        if holder is not None and holder.mode is not None and holder.mode.insert_intention:
            _give_back_intention(txn, holder)
        job.holder = None
        if job.done:
            return


def _give_back_intention(txn: Txn, req: Request[RangeMode]) -> None:
    """Drop the insert intention from `req`, and from what the call's undo would restore."""
    call = txn._call
    assert call is not None and req.mode is not None
    before = call.undo.get(req)
    if before is not None:
        call.undo[req] = before.without_insert_intention
    txn._mgr._set_held(req, req.mode.without_insert_intention)


def _try_insert(txn: Txn, index: Index, key: Any, heir: Any) -> bool:
    """Insert `key` if this txn's intention on `heir` lets it now; whether it did.

    It does when `heir` is still the key above `key` and no other owner
    holds a gap lock there.
    """
    req = txn._ranges.get((index, heir))
    fits = (
        req is not None
        and req.mode is not None
        and req.mode.insert_intention
        and index._after(key) == heir
        and not index._has(key)
        and not req.in_queue.blocked_by_granted(req, INSERT_INTENTION)
    )
    if fits:
        _split(txn, index, key, heir)
    return fits


def _split(txn: Txn, index: Index, key: Any, heir: Any) -> None:
    """`key` goes in below `heir`, splitting its gap in two; the inserter gets X on `key` (R3).

    Gap locks on `heir` are copied to `key`, since each half of the old gap
    is now a gap of its own. The only ones there belong to the inserter: any
    other owner's would have failed the check `_try_insert` just made. So
    the copy is the inserter's: a next-key X lock on `key` if it held the
    gap, else an X record lock — the explicit form of what InnoDB keeps
    implicit in the record (nobody reads or locks the new key before the
    inserter ends).
    """
    index._add(key)
    mine = txn._ranges.get((index, heir))
    held_gap = mine is not None and mine.mode is not None and mine.mode.gap
    req = Request(txn, txn._mgr._range_queue((index, key)), None, None)
    req.in_queue.add_granted(req, X_NEXT_KEY if held_gap else X_RECORD)
    txn._adopt(req)
    txn._mgr._grants += 1


def _hand_over(mgr: LockManager, queue: RangeQueue, heir_key: tuple[Index, Any]) -> None:
    """Move every request of a removed key's queue to the next key, then re-examine it (R3).

    Granted requests go over first, then waiting ones in their order, to
    the back of the next key's queue (no request goes ahead of one
    already waiting there). An owner that already has a request on the next
    key ends up with one request (L3). Inherited gap locks can make waiters
    of the next key wait for owners that are themselves waiting, without
    anyone starting a new wait, so the deadlock search runs for each waiter
    left there.
    """
    heir = mgr._range_queue(heir_key)
    granted_only = [req for req in queue.granted.values() if req.wanted is None]
    for req in [*granted_only, *queue.waiting]:
        _move(heir, req, queue.key)
    mgr._wake_granted(heir)
    for req in list(heir.waiting):
        if req.wanted is not None:
            error = mgr._resolve_deadlocks(req.owner)
            if error is not None:
                req.failure = error
                mgr._wakes.append(req)


def _move(heir: RangeQueue, req: Request[RangeMode], removed: tuple[Index, Any]) -> None:
    """Move one owner's request from the removed key to the heir queue, merging it with one it
    has there."""
    owner = req.owner
    books = owner._ranges
    del books[removed]
    other = books.get(heir.key)
    held_before = req.mode
    other_before = other.mode if other is not None else None
    held = _join(held_before.handed_on if held_before is not None else None, other_before)
    wanted = req.wanted.handed_on_waiting if req.wanted is not None else None
    parent = req.parent or (other.parent if other is not None else None)
    counted = (req.parent is not None) + (other is not None and other.parent is not None)

    survivor: Request[RangeMode] | None
    if wanted is None and other is not None:
        # `other` stays where it is in the heir's queue, waiting or not.
        survivor = other
        heir.set_granted(other, held)
        if other.wanted is not None and held is not None:
            other.wanted = other.wanted.join(held)
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
            heir.waiting.append(req)
            req.wanted = _join(wanted, held)
    req.parent = None
    if survivor is not None:
        books[heir.key] = survivor
        survivor.parent = parent if survivor.mode is not None else None
    if parent is not None:
        parent.children += (survivor is not None and survivor.mode is not None) - counted

    call = owner._call
    if call is not None and (req in call.undo or other in call.undo):
        # What the owner would hold on the heir had the call never run: the
        # same hand-over applied to what it held before the call.
        before = call.undo.pop(req, held_before)
        before_other = call.undo.pop(other, other_before) if other is not None else None
        if survivor is not None:
            call.undo[survivor] = _join(
                before.handed_on if before is not None else None, before_other
            )
