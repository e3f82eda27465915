"""The vocabulary shared by every module of the lock manager: its lock tables and what a mode is.

A manager keeps three lock tables (`Table`); every queue belongs to one, and
an owner keeps its requests in one dict per table. A mode is anything that
offers what `LockMode` lists: the five modes of `lockwarden.modes.Mode`, and
the range modes of ``_range_modes.py``. A lock call is a sequence of `Step`.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import Any, Protocol, Self

from lockwarden.modes import Mode


class Table(enum.StrEnum):
    """A lock table of the manager. The value is what `LockInfo.kind` shows."""

    DATA = "data"
    """Locks on resources of the hierarchy: ``("orders",)``, ``("orders", 42)``."""
    METADATA = "metadata"
    """One lock per table on its definition: S to use the table, X for DDL."""
    RANGE = "range"
    """Locks on the keys of ordered indexes: record, gap, next-key, insert intention."""

    # Identity hashing, as for `Mode`: members are singletons, and the
    # default enum hash is computed in Python code.
    __hash__ = object.__hash__

    @property
    def noun(self) -> str:
        """How messages name a lock of this table."""
        return _NOUNS[self]


# The members again as plain module globals, for the lock paths: on Python
# 3.11 reading an enum member through its class costs a descriptor call.
DATA, METADATA, RANGE = Table.DATA, Table.METADATA, Table.RANGE

_NOUNS = {DATA: "lock", METADATA: "metadata lock", RANGE: "range lock"}


class LockMode(Protocol):
    """What a queue needs of a mode.

    ``conflicts`` is the mask of the modes that make a request for this one
    wait when another owner holds them (or waits for them ahead of it). For
    `Mode` the relation is symmetric; for range modes it is not (an insert
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


Step = tuple[Table, Hashable, Any]
"""One step of a lock call: the lock table, the key in that table, the mode wanted there."""
