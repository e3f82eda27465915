"""Range modes: what one owner holds or wants on one key of an index, and how two conflict.

A lock on a key has a `Kind` (the record alone, the gap below the key, both
— next-key — or an insert intention) and a mode, S or X. What one owner holds
on one key is a single `RangeMode`, so a second request on the key is joined
with the first through the same upgrade path as any lock. The modes are data:
a table of every combination, built once below, with the one-way conflict
mask each carries for the queue (``_range_queue.py``).
"""

from __future__ import annotations

import enum

from lockwarden.modes import Mode

__all__ = ["ALL", "GAP", "INSERT_INTENTION", "X_NEXT_KEY", "X_RECORD", "Kind", "RangeMode", "join"]


class Kind(enum.Enum):
    """What part of a key a lock request covers."""

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
    keep inserts out, so a gap requested in S and one requested in X are
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
        """What a granted lock on a removed key becomes on the next key.

        Record and gap alike become a gap lock: the next key's gap now spans
        the removed record and its gap. A granted insert intention is
        dropped: it protects nothing, and carrying it over as granted would
        let an insert into the merged gap pass the next key's gap locks (the
        inserter asks again on the next key instead; see `insert_steps`).
        """
        return GAP if self.record is not None or self.gap else None

    @property
    def handed_on_waiting(self) -> RangeMode:
        """What a waiting request on a removed key waits for on the next key.

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
ALL = tuple(_BY_PARTS.values())
"""Every range mode, in `index` order."""


def _parts(record: Mode | None, gap: bool, insert: bool) -> RangeMode | None:
    return _BY_PARTS.get((record, gap, insert))


def _waits_for(wanted: RangeMode, held: RangeMode) -> bool:
    """Between two owners: does a lock in `held` make a request for `wanted` wait?"""
    if (
        wanted.record is not None
        and held.record is not None
        and (wanted.record is Mode.X or held.record is Mode.X)
    ):
        return True
    return wanted.insert_intention and held.gap


for _m in ALL:
    _m.conflicts = sum(h.bit for h in ALL if _waits_for(_m, h))
_JOIN = {
    (a, b): _BY_PARTS[
        max(a.record, b.record, key=_RECORDS.index),
        a.gap or b.gap,
        a.insert_intention or b.insert_intention,
    ]
    for a in ALL
    for b in ALL
}

GAP = RangeMode.of(Kind.GAP, Mode.S)
INSERT_INTENTION = RangeMode.of(Kind.INSERT_INTENTION, Mode.X)
X_RECORD = RangeMode.of(Kind.RECORD, Mode.X)
X_NEXT_KEY = RangeMode.of(Kind.NEXT_KEY, Mode.X)


def join(a: RangeMode | None, b: RangeMode | None) -> RangeMode | None:
    """The join of two modes either of which may be absent."""
    return b if a is None else a if b is None else a.join(b)
