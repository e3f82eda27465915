"""Deadlock detection: the waits-for search run when a request starts to wait, and its verdict.

A cycle in the waits-for graph can only be closed by a new wait (README.md,
"Deadlocks"), so searching from the requester at the moment it starts to wait
finds every deadlock, and finds it once: the graph had no cycle before this
edge was added, so every cycle found passes through the requester.

The search is a depth-first walk over waits-for edges: a waiting request →
the owners of incompatible granted locks and of incompatible requests ahead
of it in its queue. Its cost is the number of edges it follows, so nothing
is computed twice:

- The owner of each waiting request in a small queue keeps the owners it
  waits for (`Owner._waits_for`); every change to that queue clears them
  (`Queue.forget_edges`), so a later search reuses them until then.
  Searches repeat over the same waiters (each new waiter searches again
  from itself), so a node of a long chain or a wide fan costs its owner and
  one tuple: the request, its queue and the queue's other requests are not
  read. With 10,000 waiters the walk is bound by memory, not by the
  interpreter, so what counts is how many places a node makes it reach: the
  kept edges are a tuple (owners inline, where a list keeps them in a
  second block), the owner's `_waiting`, `_waits_for` and `_waits_mark`
  sit side by side, and visited owners are marked there (`_waits_mark`)
  instead of in a set.
- Where every mode held in a queue makes the request wait, its holders are
  the keys of `Queue.granted` (keyed by owner): 10,000 readers in front of a
  writer are listed without reading one of their requests.
- In a long queue a FIFO makes the edges quadratic (each waiter waits for
  every incompatible waiter ahead), so there the edges are not kept but
  enumerated once per (queue, mode) pair and search: granted holders once,
  the waiting list only from where the last scan of that pair stopped. An
  owner reached through a skipped edge has been pushed already, so it is
  either fully explored or on the current path, and exploring it again
  cannot reach the requester. The one edge this could lose is an edge *to
  the requester* (whose own scan skips itself), so a scan of the granted
  locks records whether the requester was among them.

The walk is bounded (InnoDB's limits): more than `max_steps` edges or a path
deeper than `max_depth` ends it, and the caller treats that as a deadlock of
the requester, which is safe: its request fails and it retries, rather than
the manager spending unbounded time under its mutex.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from lockwarden.errors import Deadlock
from lockwarden.local._queue import Owner, Queue, Request

Victim = Literal["requester", "youngest", "fewest_locks"]
VICTIMS: tuple[Victim, ...] = ("requester", "youngest", "fewest_locks")

_SMALL = 8
"""Queues with at most this many requests have their edges kept per waiting request."""
_SHOWN = 3
"""A cycle longer than twice this is shown in messages by its first and last members."""


class _Edges:
    """Waits-for edges of waiting requests, for one search."""

    __slots__ = ("ahead_done", "granted_done", "positions", "requester")

    def __init__(self, requester: Owner) -> None:
        self.requester = requester
        self.granted_done: dict[tuple[int, object], bool] = {}
        self.ahead_done: dict[tuple[int, object], int] = {}
        self.positions: dict[int, dict[int, int]] = {}

    def of(self, req: Request[Any]) -> Sequence[Owner]:
        """Owners `req` waits for that this search has not been shown yet, last in queue first.

        Kept on the owner when the queue is small; the caller has looked there first.
        """
        queue = req.in_queue
        granted = queue.granted
        waiting = queue.waiting
        if len(granted) + len(waiting) > _SMALL:
            return self._long(queue, req)
        mode = req.wanted
        owner = req.owner
        out = [
            held.owner
            for held in granted.values()
            if held.owner is not owner and mode.conflicts & held.mode.bit  # type: ignore[union-attr]
        ]
        for ahead in waiting:
            if ahead is req:
                break
            if ahead.owner is not owner and mode.conflicts & ahead.wanted.bit:  # type: ignore[union-attr]
                out.append(ahead.owner)
        out.reverse()
        kept = owner._waits_for = tuple(out)  # its owners inline: one object to reach, not two
        queue.edges_kept = True
        return kept

    def _long(self, queue: Queue[Any], req: Request[Any]) -> list[Owner]:
        mode = req.wanted
        assert mode is not None
        owner = req.owner
        granted = queue.granted
        waiting = queue.waiting
        out: list[Owner] = []
        requester = self.requester
        key = (id(queue), mode)
        saw_requester = self.granted_done.get(key)
        if saw_requester is None:
            # `granted` is keyed by owner, so whether the requester is among the holders is
            # one lookup, not a scan comparing thousands of owners; and when every mode held
            # there makes `mode` wait, the holders are its keys, without a request read.
            conflicts = mode.conflicts
            if conflicts & queue.mask == queue.mask:
                out = [*granted]
                if owner in granted:
                    out.remove(owner)
                saw_requester = requester in granted
            else:
                out = [
                    held.owner
                    for held in granted.values()
                    if conflicts & held.mode.bit and held.owner is not owner  # type: ignore[union-attr]
                ]
                held_by_requester = granted.get(requester)
                saw_requester = held_by_requester is not None and bool(
                    conflicts & held_by_requester.mode.bit  # type: ignore[union-attr]
                )
            self.granted_done[key] = saw_requester
        elif saw_requester and owner is not requester:
            out.append(requester)
        if waiting[0] is not req:
            start = self.ahead_done.get(key, 0)
            end = self._position(queue, req)
            if end > start:
                self.ahead_done[key] = end
                for i in range(start, end):
                    ahead = waiting[i]
                    if ahead.owner is not owner and queue.blocks(ahead.wanted, mode):
                        out.append(ahead.owner)
        out.reverse()
        return out

    def _position(self, queue: Queue[Any], req: Request[Any]) -> int:
        index = self.positions.get(id(queue))
        if index is None:
            index = {id(w): i for i, w in enumerate(queue.waiting)}
            self.positions[id(queue)] = index
        return index[id(req)]


def find_cycle(requester: Owner, max_steps: int, max_depth: int) -> tuple[list[Owner], bool] | None:
    """Search from `requester` (which is waiting) for a path back to it.

    Returns None when there is no cycle, else ``(path, complete)``: the owners
    from the requester along the cycle, and whether the search really closed
    it (False when a bound cut it short; the path is then as far as it got).
    """
    # The loop runs once per edge, for graphs of 10,000 waiters, under the
    # manager's mutex, and allocates nothing a node (an allocation a node
    # brings the garbage collector in). One stack of owners still to visit:
    # a node's edges are pushed at once (lists are kept last first, so pops
    # come in queue order), above the length its path had before the branch,
    # which, popped, cuts the path back. A node with one edge is followed
    # without pushing anything: chains, and a fan's waiters that each wait
    # for one running owner, cost a few reads a node.
    first = requester._waiting
    assert first is not None
    of = _Edges(requester).of
    path: list[Owner] = [requester]
    stack: list[Owner | int] = [*(requester._waits_for or of(first))]
    search = object()  # visited owners are marked with it (`Owner._waits_mark`)
    pop, push, extend = stack.pop, stack.append, stack.extend
    steps = 0
    while stack:
        nxt = pop()
        if nxt.__class__ is int:
            del path[nxt:]
            continue
        depth = len(path)
        while True:  # along a branch, as long as each node has one edge
            steps += 1
            req = nxt._waiting  # type: ignore[union-attr]
            if req is None:  # running, not waiting: the path ends here (the requester waits)
                if steps > max_steps:
                    return path, False
                del path[depth:]
                break
            if nxt is requester:
                return path, True
            if steps > max_steps:
                return path, False
            if nxt._waits_mark is search:  # type: ignore[union-attr]
                del path[depth:]
                break
            nxt._waits_mark = search  # type: ignore[union-attr]
            if len(path) >= max_depth:
                return [*path, nxt], False  # type: ignore[list-item]
            path.append(nxt)  # type: ignore[arg-type]
            edges = nxt._waits_for  # type: ignore[union-attr]
            if edges is None:
                edges = of(req)
            if len(edges) == 1:
                nxt = edges[0]
                continue
            push(depth)
            extend(edges)
            break
    return None


def choose_victim(policy: Victim, cycle: list[Owner]) -> Owner:
    """The owner whose request is refused: the requester, the youngest, or the one holding least.

    Ties of the fewest locks go to the youngest (the highest id).
    """
    if policy == "youngest":
        return max(cycle, key=lambda t: t.id)
    if policy == "fewest_locks":
        return min(cycle, key=lambda t: (t._count(), -t.id))
    return cycle[0]


def deadlock_error(victim: Owner, path: list[Owner], complete: bool) -> Deadlock:
    """The error for the victim's waiting request, naming the cycle (or the bound that was hit).

    The message shows a long cycle by its first and last members and its
    length; the error's ``cycle`` has every member, the victim first.
    """
    req = victim._waiting
    assert req is not None and req.wanted is not None
    ids = [t.id for t in path]
    start = ids.index(victim.id) if victim.id in ids else 0
    cycle = (*ids[start:], *ids[:start])
    if complete:
        reason = f"waiting would close the cycle {_shown(cycle)}"
    else:
        reason = (
            "the deadlock search hit its bound (deadlock_max_steps / deadlock_max_depth), "
            "which counts as a deadlock"
        )
    resource = req.in_queue.resource
    return Deadlock(
        f"txn {victim.id} refused {req.wanted.value} on {resource!r}: {reason}; "
        f"release its locks (or retry the transaction) to let the others through",
        name=resource,
        mode=req.wanted,
        cycle=cycle,
    )


def _shown(cycle: tuple[int, ...]) -> str:
    """``1 -> 2 -> 1``; a long cycle ``1 -> 2 -> 3 -> ... -> 8 -> 9 -> 1 (9 transactions)``."""
    if len(cycle) <= 2 * _SHOWN + 1:
        return " -> ".join(map(str, (*cycle, cycle[0])))
    first = " -> ".join(map(str, cycle[:_SHOWN]))
    last = " -> ".join(map(str, (*cycle[-_SHOWN:], cycle[0])))
    return f"{first} -> ... -> {last} ({len(cycle):,} transactions)"
