"""Deadlock detection at the moment of waiting, its bounds and victim policies."""

from __future__ import annotations

import time

import pytest

from lockwarden import Deadlock, LockManager, LockTimeout, Mode
from lockwarden.local import Txn
from tests.local.conftest import Attempt

X, S = Mode.X, Mode.S


def row(i: int) -> tuple[str, int]:
    return ("t", i)


def test_two_transactions_crossing_on_two_rows(mgr: LockManager) -> None:
    a, b = mgr.begin(), mgr.begin()
    a.lock(row(1), X)
    b.lock(row(2), X)
    wa = Attempt(a, a.lock, row(2), X, timeout=5).queued()
    with pytest.raises(Deadlock) as err:
        b.lock(row(1), X, timeout=5)
    assert err.value.cycle == (b.id, a.id)
    assert err.value.name == row(1) and err.value.mode is X
    assert f"the cycle {b.id} -> {a.id} -> {b.id};" in str(err.value)
    assert mgr.stats().deadlocks == 1
    b.release_all()
    assert wa.join() is X


def make_ring(mgr: LockManager, n: int) -> tuple[list[Txn], list[Attempt]]:
    """n transactions, each holding row i and queued for row i+1; the last closes the ring."""
    txns = [mgr.begin() for _ in range(n)]
    for i, txn in enumerate(txns):
        txn.lock(row(i), X)
    attempts = [
        Attempt(txns[i], txns[i].lock, row(i + 1), X, timeout=30).queued() for i in range(n - 1)
    ]
    attempts.append(Attempt(txns[-1], txns[-1].lock, row(0), X, timeout=30))
    return txns, attempts


def drain(txns: list[Txn], attempts: list[Attempt], victims: list[Txn]) -> None:
    """Release the victims; then every other call must get its lock (release each as it does)."""
    for v in victims:
        v.release_all()
    pending = [(t, a) for t, a in zip(txns, attempts, strict=True) if t not in victims]
    deadline = time.monotonic() + 20
    while pending:
        assert time.monotonic() < deadline, f"{len(pending)} calls never finished"
        still = []
        for txn, attempt in pending:
            if attempt.done:
                assert attempt.join() is X
                txn.release_all()
            else:
                still.append((txn, attempt))
        pending = still
        time.sleep(0.001)


def test_a_ring_of_fifty_has_exactly_one_victim_and_the_others_finish(mgr: LockManager) -> None:
    txns, attempts = make_ring(mgr, 50)
    with pytest.raises(Deadlock) as err:  # the requester is the victim, by default
        attempts[-1].join()
    assert err.value.cycle == tuple(t.id for t in [txns[-1], *txns[:-1]])
    ids = [t.id for t in txns]
    first, last = ids[-1:] + ids[:2], ids[-4:]
    shown = " -> ".join(map(str, first)) + " -> ... -> " + " -> ".join(map(str, last))
    assert f"the cycle {shown} (50 transactions)" in str(err.value)  # not all 50 ids
    assert str(ids[20]) not in str(err.value)
    assert not any(a.done for a in attempts[:-1])
    drain(txns, attempts, victims=[txns[-1]])
    assert mgr.stats().deadlocks == 1
    assert mgr.locks() == []


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("requester", 2), ("youngest", 2), ("fewest_locks", 1)],
)
def test_victim_policies(policy: str, expected: int) -> None:
    """Three txns in a cycle: ids 0 < 1 < 2 by begin order; txn 1 holds the fewest locks."""
    mgr = LockManager(victim=policy, max_wait_timeout=None)  # type: ignore[arg-type]
    t0, t1, t2 = mgr.begin(), mgr.begin(), mgr.begin()
    for i in range(5):
        t0.lock(row(100 + i), X)
        t2.lock(row(200 + i), X)
    t0.lock(row(0), X)
    t1.lock(row(1), X)
    t2.lock(row(2), X)
    txns = [t0, t1, t2]
    attempts = [
        Attempt(t0, t0.lock, row(1), X, timeout=10).queued(),
        Attempt(t1, t1.lock, row(2), X, timeout=10).queued(),
        Attempt(t2, t2.lock, row(0), X, timeout=10),  # closes the cycle
    ]
    victim = txns[expected]
    with pytest.raises(Deadlock) as err:
        attempts[expected].join()
    assert err.value.cycle[0] == victim.id
    assert set(err.value.cycle) == {t0.id, t1.id, t2.id}
    drain(txns, attempts, victims=[victim])
    assert mgr.stats().deadlocks == 1
    assert mgr.locks() == []


def test_the_depth_bound_counts_as_a_deadlock_for_the_requester() -> None:
    mgr = LockManager(deadlock_max_depth=5, max_wait_timeout=None)
    txns, attempts = make_ring(mgr, 10)
    with pytest.raises(Deadlock, match="hit its bound") as err:
        attempts[-1].join()
    assert err.value.cycle[0] == txns[-1].id
    drain(txns, attempts, victims=[txns[-1]])


def test_the_step_bound_counts_as_a_deadlock_for_the_requester() -> None:
    """Twenty readers hold row 0; a writer waiting there reaches them all (> 10 steps)."""
    mgr = LockManager(deadlock_max_steps=10, max_wait_timeout=None)
    readers = [mgr.begin() for _ in range(20)]
    for r in readers:
        r.lock(row(0), S)
    holder_of_1, writer = mgr.begin(), mgr.begin()
    holder_of_1.lock(row(1), X)
    # holder_of_1 waits for the readers; nothing waits for holder_of_1: no cycle
    w = Attempt(holder_of_1, holder_of_1.lock, row(0), X, timeout=10)
    with pytest.raises(Deadlock, match="hit its bound"):
        w.join()
    assert holder_of_1.held(row(1)) is X  # its granted locks stay
    del writer


def test_no_false_deadlock_between_independent_waiters(mgr: LockManager) -> None:
    holder = mgr.begin()
    holder.lock(row(0), X)
    waiters = [mgr.begin() for _ in range(20)]
    attempts = [Attempt(w, w.lock, row(0), X, timeout=10).queued() for w in waiters]
    assert mgr.stats().deadlocks == 0
    graph = mgr.waits_for()
    assert graph[waiters[0].id] == {holder.id}
    assert graph[waiters[5].id] == {holder.id} | {w.id for w in waiters[:5]}
    holder.unlock(row(0))
    for w, a in zip(waiters, attempts, strict=True):
        assert a.join() is X
        w.release_all()


def test_a_timeout_and_a_deadlock_in_the_same_queue(mgr: LockManager) -> None:
    """A victim refused while another waiter times out leaves a consistent table."""
    a, b, c = mgr.begin(), mgr.begin(), mgr.begin()
    a.lock(row(1), X)
    b.lock(row(2), X)
    wc = Attempt(c, c.lock, row(1), X, timeout=0.1).queued()
    wa = Attempt(a, a.lock, row(2), X, timeout=5).queued()
    with pytest.raises(Deadlock):
        b.lock(row(1), X, timeout=5)
    with pytest.raises(LockTimeout):
        wc.join()
    b.release_all()
    assert wa.join() is X
    a.release_all()
    assert mgr.locks() == []


def test_two_upgrades_in_a_long_queue(mgr: LockManager) -> None:
    """Two of twelve readers upgrade to X: a cycle through the granted locks of a long queue.

    Past eight requests a queue's edges are enumerated once per mode and search
    (``_deadlock.py``): the requester's own scan of the granted locks leaves
    itself out and is not repeated for the first upgrade, so it must record that
    the requester was among them, or the first upgrade would lead nowhere.
    """
    readers = [mgr.begin() for _ in range(12)]
    for r in readers:
        r.lock(row(0), S)
    first, second = readers[3], readers[7]
    waiting = Attempt(first, first.lock, row(0), X, timeout=10).queued()
    with pytest.raises(Deadlock) as err:
        second.lock(row(0), X, timeout=10)
    assert err.value.cycle == (second.id, first.id)
    for r in readers:
        if r is not first:
            r.release_all()
    assert waiting.join() is X
    first.release_all()
    assert mgr.locks() == []
