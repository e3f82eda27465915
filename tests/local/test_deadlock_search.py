"""The deadlock search against a brute-force one, on random histories with long queues.

The search keeps edges between searches on the waiting owners, marks the
owners it visits, and in a queue past eight requests enumerates each (queue,
mode) pair once per search (``_deadlock.py``). Every search the manager runs
here is checked at the moment it runs against the waits-for graph rebuilt
from the queues (`Queue.blockers`) and a plain search of it: a cycle through
the requester is found exactly when there is one, and the path found is one.
Fourteen owners on one table make its queue long, with intention modes,
upgrades and every victim policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any
from unittest import mock

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lockwarden import Deadlock, LockManager, LockTimeout, Mode
from lockwarden.local import _table
from lockwarden.local._deadlock import VICTIMS, Victim, find_cycle
from lockwarden.local._queue import Owner, Queue
from tests.local.conftest import assert_kept_edges_are_fresh, spin

OWNERS = 14
RESOURCES: list[tuple[Hashable, ...]] = [("a",), ("a",), ("a", 1), ("b",)]
# Mostly shared modes, so that many owners hold the table at once, then upgrade.
MODES = [Mode.IS, Mode.S, Mode.S, Mode.IX, Mode.SIX, Mode.X, Mode.X]


def brute_force_graph(mgr: LockManager) -> dict[Owner, set[Owner]]:
    """Each waiting owner → the owners it waits for, from the queues as they are."""
    graph: dict[Owner, set[Owner]] = {}
    for _, entry in mgr._all_entries():
        if isinstance(entry, Queue):
            for req in entry.waiting:
                graph[req.owner] = {b.owner for b in entry.blockers(req)}
    return graph


def on_a_cycle(graph: dict[Owner, set[Owner]], start: Owner) -> bool:
    seen: set[Owner] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node is start:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


class SearchMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.pending: dict[int, asyncio.Task[Mode]] = {}
        self.searches = 0
        self.patch = mock.patch.object(_table, "find_cycle", self.checked_search)
        self.patch.start()

    @initialize(victim=st.sampled_from(VICTIMS))
    def make(self, victim: Victim) -> None:
        self.mgr = LockManager(max_wait_timeout=None, max_ddl_wait_timeout=None, victim=victim)
        self.txns = [self.mgr.begin() for _ in range(OWNERS)]

    def teardown(self) -> None:
        for task in self.pending.values():
            task.cancel()
        self.settle()
        self.loop.close()
        self.patch.stop()

    def checked_search(
        self, requester: Owner, max_steps: int, max_depth: int
    ) -> tuple[list[Owner], bool] | None:
        """The manager's search, checked against the brute-force one (under the mutex)."""
        graph = brute_force_graph(self.mgr)
        found = find_cycle(requester, max_steps, max_depth)
        self.searches += 1
        assert (found is not None) == on_a_cycle(graph, requester), (found, graph)
        if found is not None:
            path, complete = found
            assert complete, "no bound can be hit with fourteen owners"
            assert path[0] is requester
            for a, b in zip(path, [*path[1:], requester], strict=True):
                assert b in graph[a], (a.id, b.id, graph)
        return found

    def settle(self) -> None:
        spin(self.loop)
        for i, task in list(self.pending.items()):
            if task.done():
                del self.pending[i]
                if not task.cancelled() and task.exception() is not None:
                    assert isinstance(task.exception(), LockTimeout | Deadlock), task.exception()

    @rule(
        i=st.integers(0, OWNERS - 1),
        r=st.sampled_from(RESOURCES),
        m=st.sampled_from(MODES),
        wait=st.sampled_from([0.0, None, None]),
    )
    def lock(self, i: int, r: tuple[Hashable, ...], m: Mode, wait: float | None) -> None:
        if i in self.pending or (len(r) == 2 and m not in (Mode.S, Mode.X)):
            return
        txn = self.txns[i]
        self.pending[i] = self.loop.create_task(txn.lock_async(r, m, timeout=wait))
        self.settle()

    @rule(m=st.sampled_from([Mode.IS, Mode.S]))
    def everyone_reads(self, m: Mode) -> None:
        """Every idle owner tries `m` on the table: a long queue for upgrades to meet in."""
        for i, txn in enumerate(self.txns):
            if i not in self.pending:
                self.pending[i] = self.loop.create_task(txn.lock_async(("a",), m, timeout=0))
        self.settle()

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def cancel(self, data: Any) -> None:
        self.pending[data.draw(st.sampled_from(sorted(self.pending)))].cancel()
        self.settle()

    @rule(i=st.integers(0, OWNERS - 1))
    def release_all(self, i: int) -> None:
        if i not in self.pending:
            self.txns[i].release_all()
            self.settle()

    @invariant()
    def kept_edges_are_fresh(self) -> None:
        if hasattr(self, "mgr"):
            assert_kept_edges_are_fresh(self.mgr)


TestSearch = SearchMachine.TestCase
TestSearch.settings = settings(max_examples=100, stateful_step_count=60, deadline=None)


def test_the_machine_searches_long_queues() -> None:
    """A guard on the test itself: its histories do reach queues past eight requests."""
    mgr = LockManager(max_wait_timeout=None)
    readers = [mgr.begin() for _ in range(OWNERS - 1)]
    for r in readers:
        r.lock(("a",), Mode.IS)
    entry = mgr._queues[("a",)]
    assert isinstance(entry, Queue) and len(entry.granted) > 8
