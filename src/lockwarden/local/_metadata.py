"""Metadata locks: one per table, S for statements that use it, X for DDL that changes it.

With ``metadata_locks=True`` a manager keeps them in a lock table of their
own; a transaction takes S on a table's metadata lock before its first data
lock there (``_txn.py``, or it must, in strict mode). This module holds the
one rule that differs from an ordinary queue: where a request is placed.
"""

from __future__ import annotations

from collections.abc import Hashable

from lockwarden.local._kinds import Table
from lockwarden.local._queue import Queue, Request
from lockwarden.modes import Mode

_S, _X = Mode.S, Mode.X  # plain globals: see DATA in _kinds.py


class MetadataQueue(Queue[Mode]):
    """A table's metadata lock.

    Exclusive requests go ahead of waiting shared ones, so a DDL statement is
    not starved by a stream of short queries. To keep the queries from being
    starved in turn, after `streak_limit` exclusive grants in a row while
    shared requests waited, the shared requests move ahead and new exclusive
    requests queue behind them until a shared request has been granted.
    """

    __slots__ = ("streak", "streak_limit")

    table = Table.METADATA

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
        if mode is not _X or req.mode is not None or self.streak >= self.streak_limit:
            return pos
        for i, w in enumerate(self.waiting):
            if w.mode is None and w.wanted is _S:
                return i
        return pos

    def granted_one(self, req: Request[Mode]) -> None:
        if req.mode is _S:
            self.streak = 0
            return
        if any(w.wanted is _S for w in self.waiting):
            self.streak += 1
            if self.streak >= self.streak_limit:
                # Serve the waiting shared requests first: upgrades stay in
                # front, then shared, then exclusive, each in arrival order.
                if self.edges_kept:
                    self.forget_edges()
                self.waiting.sort(key=_shared_first)


def _shared_first(w: Request[Mode]) -> int:
    return 0 if w.mode is not None else 1 if w.wanted is _S else 2
