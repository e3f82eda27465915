"""The waits-for search run when a request has to wait (rule L7).

A cycle can only be closed by a new wait, so searching from the requester at
the moment it starts to wait finds every deadlock, and finds it once: the
graph had no cycle before this edge was added, so every cycle found passes
through the requester.

The search is a depth-first walk over waits-for edges (a waiter → the owners
of incompatible granted locks and of incompatible requests ahead of it in its
queue). Two things keep it linear in the size of the graph rather than in the
number of edges, which in a long FIFO queue is quadratic (every waiter waits
for every incompatible waiter ahead of it):

- each owner is expanded once (`seen`);
- edges are not enumerated again for a (queue, mode) pair already scanned:
  granted locks once per pair, and the waiting list only from where the last
  scan of that pair stopped. An owner reached through a skipped edge has
  already been pushed, so it is either fully explored or on the current path;
  either way exploring it again cannot reach the requester. The one edge that
  must not be lost to this is an edge *to the requester* (whose own scan
  skips itself), so a granted scan records whether the requester was among
  the holders it saw.

Small queues (the usual case) are simply scanned; the memory is for the
long ones.

The walk is bounded (the seed's InnoDB limits): more than `max_steps` edges
or a path deeper than `max_depth` ends the search, and the caller treats that
as a deadlock of the requester, which is safe: its request fails and it
retries, rather than the manager spending unbounded time under its mutex.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockwarden.local._queue import Queue, Request

if TYPE_CHECKING:
    from lockwarden.local.manager import Txn

_SMALL = 8
"""Queues with at most this many requests are scanned directly, without memory."""


class _Edges:
    """Waits-for edges of waiting requests, each enumerated at most once per search."""

    __slots__ = ("ahead_done", "granted_done", "positions", "requester")

    def __init__(self, requester: Txn) -> None:
        self.requester = requester
        self.granted_done: dict[tuple[int, object], bool] = {}
        self.ahead_done: dict[tuple[int, object], int] = {}
        self.positions: dict[int, dict[int, int]] = {}

    def of(self, req: Request[Any]) -> list[Txn]:
        """Owners `req` waits for that this search has not been shown yet, in queue order."""
        queue: Queue[Any] = req.queue  # type: ignore[assignment]
        mode = req.wanted
        owner = req.owner
        granted = queue.granted
        waiting = queue.waiting
        out: list[Txn] = []
        if len(granted) + len(waiting) <= _SMALL:
            for held in granted.values():
                if held.owner is not owner and queue.blocks(held.mode, mode):
                    out.append(held.owner)
            for ahead in waiting:
                if ahead is req:
                    break
                if ahead.owner is not owner and queue.blocks(ahead.wanted, mode):
                    out.append(ahead.owner)
            return out
        requester = self.requester
        key = (id(queue), mode)
        saw_requester = self.granted_done.get(key)
        if saw_requester is None:
            saw_requester = False
            for held in granted.values():
                if queue.blocks(held.mode, mode):
                    if held.owner is requester:
                        saw_requester = True
                    if held.owner is not owner:
                        out.append(held.owner)
            self.granted_done[key] = saw_requester
        elif saw_requester and owner is not requester:
            out.append(requester)
        if waiting[0] is req:
            return out
        start = self.ahead_done.get(key, 0)
        end = self._position(queue, req)
        if end > start:
            self.ahead_done[key] = end
            for i in range(start, end):
                ahead = waiting[i]
                if ahead.owner is not owner and queue.blocks(ahead.wanted, mode):
                    out.append(ahead.owner)
        return out

    def _position(self, queue: Queue[Any], req: Request[Any]) -> int:
        index = self.positions.get(id(queue))
        if index is None:
            index = {id(w): i for i, w in enumerate(queue.waiting)}
            self.positions[id(queue)] = index
        return index[id(req)]


def find_cycle(requester: Txn, max_steps: int, max_depth: int) -> tuple[list[Txn], bool] | None:
    """Search from `requester` (which is waiting) for a path back to it.

    Returns None when there is no cycle, else ``(path, complete)``: the owners
    from the requester along the cycle, and whether the search really closed
    it (False when a bound cut it short; the path is then as far as it got).
    """
    first = requester.waiting_request
    assert first is not None
    edges = _Edges(requester)
    path: list[Txn] = [requester]
    # For each txn on the path, the owners it waits for still to visit,
    # reversed so that pop() visits them in queue order.
    todo: list[list[Txn]] = [edges.of(first)[::-1]]
    seen = {requester.id}
    steps = 0
    while todo:
        level = todo[-1]
        if not level:
            todo.pop()
            path.pop()
            continue
        nxt = level.pop()
        steps += 1
        if nxt is requester:
            return path, True
        if steps > max_steps:
            return path, False
        if nxt.id in seen:
            continue
        seen.add(nxt.id)
        req = nxt.waiting_request
        if req is None:
            continue  # running, not waiting: the path ends here
        if len(path) >= max_depth:
            return [*path, nxt], False
        path.append(nxt)
        todo.append(edges.of(req)[::-1])
    return None
