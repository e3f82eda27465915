"""The queue of one key of an index: the ordinary grant rule, with the one-way range conflicts.

The grant rule and the walk are `Queue`'s: with the one-way ``conflicts``
masks of range modes they already keep "no request is granted past a waiting
one it would wait for". Two things differ. No waiting mode blocks every other
(a gap request waits for nothing), so the walk never stops early. And the
grant of an insert intention to an insert in progress makes the insert, under
the same hold of the mutex (``_ranges.py``, `Index`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

from lockwarden.local._kinds import Table
from lockwarden.local._queue import Queue, Request
from lockwarden.local._range_modes import ALL, RangeMode


class KeySpace(Protocol):
    """What a key's queue knows of its index (`Index` in ``_ranges.py``)."""

    @property
    def name(self) -> str: ...
    @property
    def table(self) -> tuple[Hashable, ...] | None: ...
    def _intention_granted(self, req: Request[RangeMode], key: Any) -> None:
        """An insert intention on `key` was granted to `req`: an insert in progress goes in."""
        ...


class RangeQueue(Queue[RangeMode]):
    """The locks on one key of an index. Its key in the lock table is ``(index, key)``."""

    __slots__ = ()

    key: tuple[KeySpace, Any]
    table = Table.RANGE
    width = len(ALL)

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
        if req.mode is not None and req.mode.insert_intention:
            index, key = self.key
            index._intention_granted(req, key)
