"""Lock modes: what each one allows, which pairs can coexist, how they combine.

Both engines use this module. The in-process manager (``lockwarden.local``)
uses all five multi-granularity modes; the shared store (``lockwarden.store``)
uses two of them, S as "read" and X as "write".

The modes, from weakest to strongest::

            X            exclusive: nobody else may hold anything
            |
           SIX           shared + intention exclusive: read everything,
          /   \\          write some children
        IX     S         intention exclusive / shared
          \\   /
           IS            intention shared
            |
           (none)

A holder of an *intention* mode on a node promises to lock some of its
children explicitly; a holder of S, SIX or X on a node holds S (or X) on every
descendant implicitly. Two owners may hold modes on one node at the same time
only if the pair is compatible (`Mode.compatible`).

An owner holds at most one mode per resource. When it asks again, the two
requests are combined with `Mode.join`, the least upper bound in the lattice
above (IX and S give SIX), so a re-request is either already covered or an
upgrade to a single stronger mode.
"""

from __future__ import annotations

import enum

__all__ = ["Mode"]


class Mode(enum.Enum):
    """A lock mode. ``Mode.S`` is "read" and ``Mode.X`` is "write" in the shared store."""

    IS = "IS"
    IX = "IX"
    S = "S"
    SIX = "SIX"
    X = "X"

    # Members are singletons, so identity hashing is exact. Enum's own
    # __hash__ hashes the member name in Python code, which triples the cost
    # of every dict lookup keyed by a mode on the lock manager's hot path.
    __hash__ = object.__hash__

    # Per-member tables, filled in once below the class. Plain instance
    # attributes are the fastest thing to read on the hot path.
    index: int
    """Position in IS, IX, S, SIX, X: lets tables of counts be plain lists."""
    bit: int
    """``1 << index``; sets of modes are bit masks."""
    conflicts: int
    """Mask of the modes that cannot be held by another owner alongside this one."""

    def compatible(self, other: Mode) -> bool:
        """Whether two different owners may hold `self` and `other` on one resource."""
        return not self.conflicts & other.bit

    def join(self, other: Mode) -> Mode:
        """The least upper bound: the single mode that gives both `self` and `other`."""
        return _JOIN[self, other]

    def covers(self, other: Mode) -> bool:
        """Whether holding `self` already gives everything `other` would."""
        return _JOIN[self, other] is self

    @property
    def is_intention(self) -> bool:
        """IS and IX only announce locks on children; they lock no data themselves."""
        return self is Mode.IS or self is Mode.IX

    @property
    def parent_intention(self) -> Mode:
        """The mode every ancestor must hold before this mode is taken on a child.

        Reading below a node needs IS on it; writing below it needs IX.
        """
        return Mode.IS if self is Mode.IS or self is Mode.S else Mode.IX

    @property
    def implied_on_descendants(self) -> Mode | None:
        """What holding this mode on a node gives on every node below it.

        S and SIX read the whole subtree, X writes it; intention modes give nothing.
        """
        return _IMPLIED[self]

    @classmethod
    def parse(cls, value: Mode | str) -> Mode:
        """Accept a Mode, a mode name ("IX", "six"), or "read"/"write" (also "shared"/"exclusive").

        Raises `LockUsageError` naming the accepted spellings otherwise.
        """
        if isinstance(value, Mode):
            return value
        if isinstance(value, str):
            found = _SPELLINGS.get(value.strip().lower())
            if found is not None:
                return found
        from lockwarden.errors import LockUsageError  # noqa: PLC0415  (errors imports nothing from here)

        raise LockUsageError(
            f"unknown lock mode {value!r}: use 'read' or 'write' "
            f"(or one of {', '.join(m.value for m in cls)})"
        )

    def __repr__(self) -> str:
        return f"Mode.{self.value}"

    def __str__(self) -> str:
        """The mode as the command line and its JSON write it: `word` ("read", "write",
        "IX", ...), which `parse` reads back. f-strings and ``print`` show it too."""
        return self.word

    @property
    def word(self) -> str:
        """How the shared store says this mode: "read" for S, "write" for X (others: the name)."""
        return "read" if self is Mode.S else "write" if self is Mode.X else self.value


_ORDER = (Mode.IS, Mode.IX, Mode.S, Mode.SIX, Mode.X)

# Which pairs may be held together by two different owners.
_COMPATIBLE_PAIRS = {
    (Mode.IS, Mode.IS), (Mode.IS, Mode.IX), (Mode.IS, Mode.S), (Mode.IS, Mode.SIX),
    (Mode.IX, Mode.IX),
    (Mode.S, Mode.S),
}  # fmt: skip

# The lattice, as the set of modes each mode covers (itself included).
_COVERS = {
    Mode.IS: {Mode.IS},
    Mode.IX: {Mode.IS, Mode.IX},
    Mode.S: {Mode.IS, Mode.S},
    Mode.SIX: {Mode.IS, Mode.IX, Mode.S, Mode.SIX},
    Mode.X: set(_ORDER),
}

_IMPLIED: dict[Mode, Mode | None] = {
    Mode.IS: None, Mode.IX: None, Mode.S: Mode.S, Mode.SIX: Mode.S, Mode.X: Mode.X,
}  # fmt: skip


def _least_upper_bound(a: Mode, b: Mode) -> Mode:
    # The weakest mode that covers both; in this lattice it is unique.
    uppers = [m for m in _ORDER if a in _COVERS[m] and b in _COVERS[m]]
    return min(uppers, key=lambda m: len(_COVERS[m]))


_JOIN = {(a, b): _least_upper_bound(a, b) for a in _ORDER for b in _ORDER}

for _i, _mode in enumerate(_ORDER):
    _mode.index = _i
    _mode.bit = 1 << _i
for _mode in _ORDER:
    _mode.conflicts = sum(
        other.bit
        for other in _ORDER
        if (_mode, other) not in _COMPATIBLE_PAIRS and (other, _mode) not in _COMPATIBLE_PAIRS
    )

_SPELLINGS = {m.value.lower(): m for m in _ORDER} | {
    "read": Mode.S,
    "shared": Mode.S,
    "write": Mode.X,
    "exclusive": Mode.X,
}
