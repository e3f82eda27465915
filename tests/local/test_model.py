"""A model-based test of the manager: random histories, invariants checked after every step.

Several owners lock, wait, give up (cancellation or a real timeout), unlock
and release everything, on two tables and their rows. The owners are asyncio
tasks on one loop, so requests really queue and are granted by other owners'
releases, while the test stays single-threaded and replayable.

After every step:

- no two owners hold incompatible granted modes on one resource;
- no waiter could be granted: each one conflicts with a granted lock of
  another owner or with a request waiting ahead of it (no lost wake-up);
- the waits-for graph has no cycle (every cycle is broken when it forms);
- the edges the deadlock search keeps are those the queues give now;
- the snapshot agrees with every owner's `held()` and with the calls that
  are still pending; queues exist only for resources in the snapshot;
- every row lock has its parent's intention lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lockwarden import Deadlock, LockManager, LockTimeout, LockUsageError, Mode, NotHeld
from lockwarden.local import Txn
from tests.local.conftest import assert_kept_edges_are_fresh, spin

OWNERS = 4
RESOURCES: list[tuple[Hashable, ...]] = [("a",), ("b",), ("a", 1), ("a", 2), ("b", 1)]
modes = st.sampled_from(list(Mode))
patience = st.sampled_from([0.0, 0.001, None])


class LockTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.mgr = LockManager(max_wait_timeout=None, max_ddl_wait_timeout=None)
        self.txns = [self.mgr.begin() for _ in range(OWNERS)]
        self.pending: dict[int, asyncio.Task[Mode]] = {}

    def teardown(self) -> None:
        for task in self.pending.values():
            task.cancel()
        self.settle()
        self.loop.close()

    # -- driving the loop ---------------------------------------------------------

    def settle(self, seconds: float = 0.0) -> None:
        """Run the loop until every task that can move has moved."""
        spin(self.loop, seconds)
        for i, task in list(self.pending.items()):
            if task.done():
                del self.pending[i]
                if not task.cancelled() and task.exception() is not None:
                    assert isinstance(task.exception(), LockTimeout | Deadlock), task.exception()

    def idle(self, i: int) -> bool:
        return i not in self.pending

    # -- rules --------------------------------------------------------------------

    @rule(i=st.integers(0, OWNERS - 1), r=st.sampled_from(RESOURCES), m=modes, wait=patience)
    def lock(self, i: int, r: tuple[Hashable, ...], m: Mode, wait: float | None) -> None:
        if not self.idle(i):
            return
        if len(r) == 2 and m not in (Mode.S, Mode.X):
            return
        txn = self.txns[i]
        self.pending[i] = self.loop.create_task(txn.lock_async(r, m, timeout=wait))
        self.settle(0.002 if wait else 0.0)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def cancel(self, data: Any) -> None:
        i = data.draw(st.sampled_from(sorted(self.pending)))
        self.pending[i].cancel()
        self.settle()

    @rule(i=st.integers(0, OWNERS - 1), r=st.sampled_from(RESOURCES))
    def unlock(self, i: int, r: tuple[Hashable, ...]) -> None:
        if not self.idle(i):
            return
        txn = self.txns[i]
        before = self.snapshot()
        try:
            txn.unlock(r)
        except (LockUsageError, NotHeld):
            assert self.snapshot() == before  # a refused unlock changes nothing
        self.settle()

    @rule(i=st.integers(0, OWNERS - 1))
    def release_all(self, i: int) -> None:
        if not self.idle(i):
            return
        self.txns[i].release_all()
        self.settle()
        assert not [x for x in self.mgr.locks() if x.owner == self.txns[i].id]

    # -- invariants -----------------------------------------------------------------

    def snapshot(self) -> set[tuple[object, int, Mode, bool]]:
        return {(x.resource, x.owner, x.mode, x.granted) for x in self.mgr.locks()}

    @invariant()
    def granted_locks_are_compatible(self) -> None:
        by_resource: dict[object, list[tuple[int, Mode]]] = {}
        for x in self.mgr.locks():
            if x.granted:
                by_resource.setdefault(x.resource, []).append((x.owner, x.mode))
        for holders in by_resource.values():
            owners = [o for o, _ in holders]
            assert len(owners) == len(set(owners)), "one lock per owner per resource"
            for a, ma in holders:
                for b, mb in holders:
                    if a != b:
                        assert ma.compatible(mb), (holders, ma, mb)

    @invariant()
    def no_waiter_could_be_granted(self) -> None:
        for key, entry in self.mgr._queues.items():
            if not hasattr(entry, "waiting"):
                continue
            ahead: list[Any] = []
            for req in entry.waiting:
                others = [g for g in entry.granted.values() if g.owner is not req.owner]
                blocked = any(not g.mode.compatible(req.wanted) for g in others) or any(
                    not a.wanted.compatible(req.wanted) for a in ahead
                )
                assert blocked, f"waiter {req.owner.id} on {key} could be granted"
                ahead.append(req)

    @invariant()
    def kept_edges_are_fresh(self) -> None:
        assert_kept_edges_are_fresh(self.mgr)

    @invariant()
    def waits_for_graph_is_acyclic(self) -> None:
        graph = self.mgr.waits_for()
        state: dict[int, int] = {}

        def visit(node: int) -> None:
            state[node] = 1
            for nxt in graph.get(node, ()):
                assert state.get(nxt) != 1, f"cycle through {node} and {nxt}: {graph}"
                if nxt not in state:
                    visit(nxt)
            state[node] = 2

        for node in graph:
            if node not in state:
                visit(node)

    @invariant()
    def snapshot_agrees_with_owners(self) -> None:
        infos = self.mgr.locks()
        granted = {(x.resource, x.owner): x.mode for x in infos if x.granted}
        waiting = {x.owner for x in infos if not x.granted}
        pending = {self.txns[i].id for i in self.pending}
        assert waiting <= pending
        for txn in self.txns:
            assert (txn._waiting is not None) == (txn.id in waiting)
            for r in RESOURCES:
                explicit = granted.get((r, txn.id))
                parent = granted.get((r[:1], txn.id)) if len(r) == 2 else None
                implied = parent.implied_on_descendants if parent else None
                expected = explicit if implied is None else implied.join(explicit or implied)
                assert txn.held(r) is expected, (txn.id, r, txn.held(r), expected)
            for r in RESOURCES:
                if len(r) == 2 and (r, txn.id) in granted:
                    parent = granted.get((r[:1], txn.id))
                    need = granted[(r, txn.id)].parent_intention
                    assert parent is not None and parent.covers(need), (r, parent)
        locked = {x.resource for x in infos}
        assert set(self.mgr._queues) == locked


TestLockTable = LockTableMachine.TestCase
TestLockTable.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_txn_type_is_what_the_machine_drives() -> None:
    assert isinstance(LockManager().begin(), Txn)
