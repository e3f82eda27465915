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

The walk is bounded (the seed's InnoDB limits): more than `max_steps` edges
or a path deeper than `max_depth` ends the search, and the caller treats that
as a deadlock of the requester, which is safe: its request fails and it
retries, rather than the manager spending unbounded time under its mutex.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from lockwarden.local._queue import Queue, Request

if TYPE_CHECKING:
    from lockwarden.local.manager import Txn

TOO_DEEP = "bound"


class _Scans:
    """Memory of which (queue, mode) edges one search has already enumerated."""

    __slots__ = ("ahead_done", "granted_done", "positions", "requester")

    def __init__(self, requester: Txn) -> None:
        self.requester = requester
        self.granted_done: dict[tuple[int, object], bool] = {}
        self.ahead_done: dict[tuple[int, object], int] = {}
        self.positions: dict[int, dict[int, int]] = {}

    def _position(self, queue: Queue, req: Request) -> int:
        index = self.positions.get(id(queue))
        if index is None:
            index = {id(w): i for i, w in enumerate(queue.waiting)}
            self.positions[id(queue)] = index
        return index[id(req)]

    def edges(self, req: Request) -> Iterator[Txn]:
        """Owners `req` waits for that this search has not been shown yet."""
        queue: Queue = req.in_queue
        mode = req.wanted
        owner = req.owner
        requester = self.requester
        key = (id(queue), mode)
        saw_requester = self.granted_done.get(key)
        if saw_requester is None:
            saw_requester = False
            for held in queue.granted.values():
                if queue.blocks(held.mode, mode):  # type: ignore[arg-type]
                    if held.owner is requester:
                        saw_requester = True
                    if held.owner is not owner:
                        yield held.owner
            self.granted_done[key] = saw_requester
        elif saw_requester and owner is not requester:
            yield requester
        start = self.ahead_done.get(key, 0)
        end = self._position(queue, req)
        if end <= start:
            return
        self.ahead_done[key] = end
        waiting = queue.waiting
        for i in range(start, end):
            ahead = waiting[i]
            if ahead.owner is not owner and queue.blocks(ahead.wanted, mode):  # type: ignore[arg-type]
                yield ahead.owner


def find_cycle(requester: Txn, max_steps: int, max_depth: int) -> tuple[list[Txn], bool] | None:
    """Search from `requester` (which is waiting) for a path back to it.

    Returns None when there is no cycle, else ``(path, complete)``: the owners
    from the requester along the cycle, and whether the search really closed
    it (False when a bound cut it short; the path is then as far as it got).
    """
    first = requester.waiting_request
    assert first is not None
    scans = _Scans(requester)
    path: list[Txn] = [requester]
    stack: list[Iterator[Txn]] = [scans.edges(first)]
    seen = {requester.id}
    steps = 0
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            path.pop()
            continue
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
        stack.append(scans.edges(req))
    return None
