"""Range locks against a reference model: random histories, the whole lock table compared.

The model is written from the rules, not from the code: per key, the modes
granted to each owner (in grant order) and the waiting requests (in queue
order); the conflict rule as a function of two modes; the grant rule for
arrivals and for the walk after a departure; how insert and remove move
locks (src/lockwarden/local/README.md, "Range locks"); a wait that closes
a cycle in the waits-for graph is refused (the default victim, the
requester); a call that fails leaves its owner holding what it held before,
with the index changes made meanwhile applied to that too.

Owners are asyncio tasks on one loop, so requests really queue and are woken
by other owners' releases while the test stays single-threaded: the model
replays the wake-ups in the order the manager issues them. One rule removes a
key after a release and before the tasks it woke run again, as another
thread could between a grant and the waiter's return. After every step
the snapshot (`mgr.locks()`) must equal the model's, key by key, waiting
order included; every call that ended must have ended as the model says.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lockwarden import Deadlock, LockManager, LockTimeout, LockUsageError, Mode
from lockwarden.local import SUPREMUM, Kind
from tests.local.conftest import assert_kept_edges_are_fresh, spin

OWNERS = 4
INITIAL = (10, 20, 30)
NEW_KEYS = (5, 15, 20, 25, 35)

# A mode as the model sees it: (record 0/1/2 for none/S/X, gap, insert intention).
M = tuple[int, bool, bool]


def requested(kind: Kind, mode: Mode, key: object) -> M:
    record = (
        0 if key is SUPREMUM or kind in (Kind.GAP, Kind.INSERT_INTENTION) else 1 + (mode is Mode.X)
    )
    return (record, kind in (Kind.GAP, Kind.NEXT_KEY), kind is Kind.INSERT_INTENTION)


def join(a: M | None, b: M | None) -> M | None:
    if a is None or b is None:
        return a or b
    return (max(a[0], b[0]), a[1] or b[1], a[2] or b[2])


def waits(wanted: M, held: M) -> bool:
    """Records conflict as S and X; an insert waits for a gap; nothing else waits."""
    records = wanted[0] and held[0] and max(wanted[0], held[0]) == 2
    return bool(records or (wanted[2] and held[1]))


def handed_on(held: M | None) -> M | None:
    return (0, True, False) if held and (held[0] or held[1]) else None


def handed_on_waiting(wanted: M) -> M:
    return (0, bool(wanted[0] or wanted[1]), wanted[2])


def without_insert(held: M) -> M | None:
    return None if held[:2] == (0, False) else (held[0], held[1], False)


def observed(mode: Any) -> M:
    return (
        0 if mode.record is None else 1 + (mode.record is Mode.X),
        mode.gap,
        mode.insert_intention,
    )


INSERT: M = (0, False, True)


@dataclass
class Queue:
    granted: dict[int, M] = field(default_factory=dict)
    waiting: list[list[Any]] = field(default_factory=list)  # [owner, wanted]


@dataclass
class Call:
    kind: str  # "lock" or "insert"
    patience: float
    before: dict[object, M]  # the owner's locks when the call started, index changes applied
    insert_key: object = None
    asked: object = None  # the key of the step it waits for (or was granted)
    inserted: bool = False
    holder: object = None  # where the insert's intention was granted last
    outcome: str | None = None  # None while it runs; then "ok", "timeout", "deadlock", "usage"
    result: M | None = None


class Model:
    def __init__(self) -> None:
        self.keys: list[Any] = sorted(INITIAL)
        self.queues: dict[object, Queue] = {}
        self.calls: dict[int, Call] = {}
        self.woken: list[int] = []

    # -- reading -----------------------------------------------------------------

    def next_key(self, key: object) -> object:
        return next((k for k in self.keys if k > key), SUPREMUM)

    def held(self, owner: int) -> dict[object, M]:
        return {k: q.granted[owner] for k, q in self.queues.items() if owner in q.granted}

    def queue(self, key: object) -> Queue:
        return self.queues.setdefault(key, Queue())

    def tidy(self, key: object) -> None:
        q = self.queues.get(key)
        if q is not None and not q.granted and not q.waiting:
            del self.queues[key]

    def edges(self) -> dict[int, set[int]]:
        graph: dict[int, set[int]] = {}
        for q in self.queues.values():
            for i, (owner, wanted) in enumerate(q.waiting):
                out = graph.setdefault(owner, set())
                out |= {o for o, h in q.granted.items() if o != owner and waits(wanted, h)}
                out |= {o for o, w in q.waiting[:i] if o != owner and waits(wanted, w)}
        return graph

    def on_a_cycle(self, owner: int) -> bool:
        graph, seen, todo = self.edges(), set(), [owner]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == owner:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    # -- the grant rule ------------------------------------------------------------

    def walk(self, key: object) -> None:
        q = self.queues.get(key)
        if q is None:
            return
        ahead: list[M] = []
        for entry in list(q.waiting):
            owner, wanted = entry
            others = [h for o, h in q.granted.items() if o != owner]
            if any(waits(wanted, h) for h in [*others, *ahead]):
                ahead.append(wanted)
                continue
            q.waiting.remove(entry)
            q.granted[owner] = wanted
            self.granted(owner, key)
            self.woken.append(owner)
        self.tidy(key)

    def granted(self, owner: int, key: object) -> None:
        """A lock call's result is the mode granted, whatever a removal does before it returns;
        an insert goes in the moment its intention is granted, if the gap is still its."""
        call = self.calls.get(owner)
        if call is None or call.outcome is not None:
            return
        if call.kind == "lock":
            call.result = self.queues[key].granted[owner]
        else:
            call.holder = key
            call.inserted = self.try_insert(owner, key)

    def request(self, owner: int, key: object, mode: M, patience: float) -> str:
        """One step of a call: "ok" (granted or covered), "timeout", "deadlock" or "queued"."""
        q = self.queue(key)
        held = q.granted.get(owner)
        want = join(held, mode)
        assert want is not None
        if want == held:
            return "ok"
        pos = len(q.waiting)
        if held is not None:  # an upgrade: after the upgrades at the head of the queue
            pos = next((i for i, (o, _) in enumerate(q.waiting) if o not in q.granted), pos)
        others = [h for o, h in q.granted.items() if o != owner]
        if not any(waits(want, h) for h in [*others, *(w for _, w in q.waiting[:pos])]):
            q.granted[owner] = want
            self.granted(owner, key)
            return "ok"
        if patience == 0:
            self.tidy(key)
            return "timeout"
        q.waiting.insert(pos, [owner, want])
        if self.on_a_cycle(owner):
            self.leave(owner)
            return "deadlock"
        return "queued"

    def leave(self, owner: int) -> None:
        """The owner's waiting request goes (timeout, cancellation, deadlock victim)."""
        for key, q in list(self.queues.items()):
            for entry in q.waiting:
                if entry[0] == owner:
                    q.waiting.remove(entry)
                    self.walk(key)
                    return

    def set_held(self, owner: int, key: object, mode: M | None) -> None:
        q = self.queue(key)
        if mode is None:
            q.granted.pop(owner, None)
        else:
            q.granted[owner] = mode
        self.walk(key)

    def fail(self, owner: int, outcome: str) -> None:
        call = self.calls[owner]
        for key in set(self.held(owner)) | set(call.before):
            if self.held(owner).get(key) != call.before.get(key):
                self.set_held(owner, key, call.before.get(key))
        call.outcome = outcome

    # -- insert and remove-------------------------------------------------------------------

    def split(self, owner: int, key: object, heir: object) -> None:
        self.keys = sorted([*self.keys, key])
        had_gap = self.queue(heir).granted[owner][1]
        self.queue(key).granted[owner] = (2, had_gap, False)

    def remove(self, key: object) -> None:
        self.keys.remove(key)
        heir = self.next_key(key)
        old = self.queues.pop(key, None)
        for call in self.calls.values():
            if call.outcome is None and key in call.before:
                merged = join(call.before.get(heir), handed_on(call.before.pop(key)))
                if merged is not None:
                    call.before[heir] = merged
        if old is None:
            return
        q = self.queue(heir)
        movers = [o for o in old.granted if not any(w[0] == o for w in old.waiting)]
        for owner in [*movers, *(w[0] for w in old.waiting)]:
            mine = old.granted.get(owner)
            wanted = next((w for o, w in old.waiting if o == owner), None)
            held = join(handed_on(mine), q.granted.get(owner))
            waiting_there = next((e for e in q.waiting if e[0] == owner), None)
            if wanted is None and (owner in q.granted or waiting_there):
                if held is not None:
                    q.granted[owner] = held
                if waiting_there is not None:
                    waiting_there[1] = join(waiting_there[1], held)
                continue
            q.granted.pop(owner, None)
            if held is not None:
                q.granted[owner] = held
            if wanted is not None:
                q.waiting.append([owner, join(handed_on_waiting(wanted), held)])
                if self.calls[owner].kind == "lock":
                    self.calls[owner].asked = heir
        self.walk(heir)
        for owner, _ in list(self.queue(heir).waiting):
            if any(e[0] == owner for e in self.queue(heir).waiting) and self.on_a_cycle(owner):
                self.leave(owner)
                self.woken.append(owner)
                self.calls[owner].outcome = "deadlock-pending"
        self.tidy(heir)

    # -- calls ------------------------------------------------------------------------

    def insert_step(self, owner: int) -> None:
        """Ask for the insert intention on the key above, until inserted, queued or failed."""
        call = self.calls[owner]
        while True:
            if call.insert_key in self.keys:
                self.fail(owner, "usage")
                return
            call.asked = self.next_key(call.insert_key)
            step = self.request(owner, call.asked, INSERT, call.patience)
            if step != "ok":
                if step != "queued":
                    self.fail(owner, step)
                return
            if self.resume_insert(owner):
                return

    def try_insert(self, owner: int, heir: object) -> bool:
        call = self.calls[owner]
        q = self.queues.get(heir)
        mine = q.granted.get(owner) if q is not None else None
        others = [h for o, h in q.granted.items() if o != owner] if q is not None else []
        fits = (
            mine is not None
            and mine[2]
            and self.next_key(call.insert_key) == heir
            and call.insert_key not in self.keys
            and not any(h[1] for h in others)
        )
        if fits:
            self.split(owner, call.insert_key, heir)
        return fits

    def resume_insert(self, owner: int) -> bool:
        """The inserter runs again: insert now if the grant could not, give the intention back."""
        call = self.calls[owner]
        holder = call.asked if call.holder is None else call.holder
        if not call.inserted:
            call.inserted = self.try_insert(owner, call.asked)
        mine = self.held(owner).get(holder)
        if mine is not None and mine[2]:  # given back, also if the txn had it before the call
            self.set_held(owner, holder, without_insert(mine))
            earlier = call.before.pop(holder, None)
            kept = without_insert(earlier) if earlier is not None else None
            if kept is not None:
                call.before[holder] = kept
        call.holder = None
        if call.inserted:
            call.outcome = "ok"
        return call.inserted

    def settle(self) -> None:
        """Run the wake-ups in the order they were issued, and whatever they cause."""
        while self.woken:
            owner = self.woken.pop(0)
            call = self.calls[owner]
            if call.outcome == "deadlock-pending":
                self.fail(owner, "deadlock")
            elif call.kind == "lock":
                call.outcome = "ok"
            elif not self.resume_insert(owner):
                self.insert_step(owner)


kinds = st.sampled_from(Kind)
modes = st.sampled_from([Mode.S, Mode.X])
patience = st.sampled_from([0.0, 0.001, math.inf, math.inf])


def _timeout(patience: float) -> float | None:
    """The call's timeout for a patience of the model (infinite: None, no limit)."""
    return None if patience == math.inf else patience


class RangeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.mgr = LockManager(max_wait_timeout=None)
        self.index = self.mgr.index("pk", keys=INITIAL)
        self.txns = [self.mgr.begin() for _ in range(OWNERS)]
        self.ids = [t.id for t in self.txns]
        self.tasks: dict[int, asyncio.Task[Any]] = {}
        self.model = Model()

    def teardown(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.spin()
        self.loop.close()

    def spin(self, seconds: float = 0.0) -> None:
        spin(self.loop, seconds)

    def idle(self, i: int) -> bool:
        return (
            self.ids[i] not in self.model.calls or self.model.calls[self.ids[i]].outcome is not None
        )

    def start(self, i: int, coro: Any, call: Call) -> None:
        owner = self.ids[i]
        self.tasks[owner] = self.loop.create_task(coro)
        self.model.calls[owner] = call
        self.spin(0.003 if 0 < call.patience < math.inf else 0.0)

    def finish_timeouts(self, owner: int) -> None:
        call = self.model.calls.get(owner)
        if call is not None and call.outcome is None and 0 < call.patience < math.inf:
            self.model.leave(owner)
            self.model.fail(owner, "timeout")
            self.model.settle()

    # -- rules ------------------------------------------------------------------------

    def owner(self, data: Any) -> int:
        """An owner with no call in progress (the rules that use one require there is one)."""
        return int(data.draw(st.sampled_from([i for i in range(OWNERS) if self.idle(i)])))

    def some_idle(self) -> bool:
        return any(self.idle(i) for i in range(OWNERS))

    @precondition(some_idle)
    @rule(data=st.data(), kind=kinds, mode=modes, patience=patience)
    def lock(self, data: Any, kind: Kind, mode: Mode, patience: float) -> None:
        key = data.draw(st.sampled_from([*self.model.keys, SUPREMUM, 15]))  # 15: maybe absent
        self.lock_key(data, key, kind, mode, patience)

    @precondition(lambda self: self.some_idle() and self.model.keys)
    @rule(data=st.data(), kind=kinds, mode=modes, patience=patience)
    def lock_the_middle_key(self, data: Any, kind: Kind, mode: Mode, patience: float) -> None:
        """Most calls meet on one key, so that they queue and wait for each other."""
        self.lock_key(data, self.model.keys[len(self.model.keys) // 2], kind, mode, patience)

    def lock_key(self, data: Any, key: object, kind: Kind, mode: Mode, patience: float) -> None:
        i, model = self.owner(data), self.model
        owner = self.ids[i]
        call = Call("lock", patience, model.held(owner), asked=key)
        coro = self.txns[i].lock_key_async(self.index, key, kind, mode, timeout=_timeout(patience))
        if (key is not SUPREMUM and key not in model.keys) or (
            key is SUPREMUM and kind is Kind.RECORD
        ):
            call.outcome = "usage"
        else:
            step = model.request(owner, key, requested(kind, mode, key), patience)
            if step != "queued":
                call.outcome = step
                call.result = model.queues[key].granted[owner] if step == "ok" else None
        model.settle()
        self.start(i, coro, call)
        self.finish_timeouts(owner)

    def no_insert_waits(self) -> bool:
        return self.some_idle() and not any(
            c.kind == "insert" and c.outcome is None for c in self.model.calls.values()
        )

    @precondition(no_insert_waits)
    @rule(data=st.data(), wait=st.booleans())
    def insert(self, data: Any, wait: bool) -> None:
        i, model = self.owner(data), self.model
        owner = self.ids[i]
        absent = [k for k in NEW_KEYS if k not in model.keys]
        key = data.draw(st.sampled_from([*absent, *absent, *model.keys[:1]]))  # some are there
        patience = math.inf if wait else 0.0
        call = Call("insert", patience, model.held(owner), insert_key=key)
        coro = self.txns[i].insert_async(self.index, key, timeout=_timeout(patience))
        model.calls[owner] = call
        model.insert_step(owner)
        model.settle()
        self.start(i, coro, call)

    @rule(data=st.data())
    def remove(self, data: Any) -> None:
        key = data.draw(st.sampled_from([*self.model.keys, 15]))
        if key not in self.model.keys:
            with pytest.raises(LockUsageError):
                self.index.remove(key)
            return
        self.remove_key(key)

    @precondition(lambda self: self.model.keys)
    @rule()
    def remove_the_middle_key(self) -> None:
        self.remove_key(self.model.keys[len(self.model.keys) // 2])

    def remove_key(self, key: object) -> None:
        self.index.remove(key)
        self.model.remove(key)
        self.model.settle()
        self.spin()

    @precondition(lambda self: self.some_idle() and self.model.keys)
    @rule(data=st.data())
    def release_all_then_remove(self, data: Any) -> None:
        """A removal lands between the grants a release makes and the granted calls' return:
        their tasks run only after both."""
        i = self.owner(data)
        gave_up = [k for k in self.model.held(self.ids[i]) if k in self.model.keys]
        key = data.draw(st.sampled_from(gave_up or self.model.keys))  # where it granted others
        self.txns[i].release_all()
        for held in list(self.model.held(self.ids[i])):
            self.model.set_held(self.ids[i], held, None)
        self.remove_key(key)

    @precondition(some_idle)
    @rule(data=st.data())
    def release_all(self, data: Any) -> None:
        i = self.owner(data)
        self.txns[i].release_all()
        self.released(i, list(self.model.held(self.ids[i])))

    @precondition(some_idle)
    @rule(data=st.data())
    def unlock_key(self, data: Any) -> None:
        i = self.owner(data)
        held = self.model.held(self.ids[i])
        if held:
            key = data.draw(st.sampled_from(sorted(held, key=lambda k: (k is SUPREMUM, k))))
            self.txns[i].unlock_key(self.index, key)
            self.released(i, [key])

    def released(self, i: int, keys: list[object]) -> None:
        for key in keys:
            self.model.set_held(self.ids[i], key, None)
        self.model.settle()
        self.spin()

    @precondition(lambda self: not all(self.idle(i) for i in range(OWNERS)))
    @rule(data=st.data())
    def cancel(self, data: Any) -> None:
        i = data.draw(st.sampled_from([i for i in range(OWNERS) if not self.idle(i)]))
        owner = self.ids[i]
        self.tasks[owner].cancel()
        self.model.leave(owner)
        self.model.fail(owner, "cancelled")
        self.model.settle()
        self.spin()

    # -- comparing --------------------------------------------------------------------

    @invariant()
    def the_lock_table_is_the_models(self) -> None:
        seen: dict[object, Queue] = {}
        for info in self.mgr.locks():
            assert info.kind == "range"
            q = seen.setdefault(info.resource[1], Queue())
            if info.granted:
                q.granted[info.owner] = observed(info.mode)
            else:
                q.waiting.append([info.owner, observed(info.mode)])
        expected = {k: q for k, q in self.model.queues.items() if q.granted or q.waiting}
        assert {k: (q.granted, q.waiting) for k, q in seen.items()} == {
            k: (q.granted, q.waiting) for k, q in expected.items()
        }
        assert self.index.keys() == self.model.keys

    @invariant()
    def each_txn_holds_what_the_table_says(self) -> None:
        """What a txn says it holds on each key (its own books) is what the model grants it."""
        for i, txn in enumerate(self.txns):
            for key in [*self.model.keys, SUPREMUM]:
                mode = txn.held_key(self.index, key)
                held = self.model.held(self.ids[i]).get(key)
                assert (observed(mode) if mode is not None else None) == held, (txn.id, key)

    @invariant()
    def calls_ended_as_the_model_says(self) -> None:
        errors = {"timeout": LockTimeout, "deadlock": Deadlock, "usage": LockUsageError}
        for owner, call in self.model.calls.items():
            task = self.tasks[owner]
            assert task.done() == (call.outcome is not None), (owner, call)
            if call.outcome is None or call.outcome == "cancelled":
                continue
            if call.outcome == "ok":
                result = task.result()
                if call.kind == "lock":
                    assert observed(result) == call.result
            else:
                assert isinstance(task.exception(), errors[call.outcome]), (call, task.exception())

    @invariant()
    def the_waits_for_graph_is_acyclic(self) -> None:
        assert self.mgr.waits_for() == self.model.edges()
        assert not any(self.model.on_a_cycle(o) for o in self.model.edges())
        assert_kept_edges_are_fresh(self.mgr)


TestRangeLocks = RangeMachine.TestCase
TestRangeLocks.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
