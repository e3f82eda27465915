"""FIFO queues, upgrades and timeouts."""

from __future__ import annotations

import time

import pytest

from lockwarden import Deadlock, LockManager, LockTimeout, LockUsageError, Mode
from tests.local.conftest import Attempt

IS, IX, S, SIX, X = Mode.IS, Mode.IX, Mode.S, Mode.SIX, Mode.X
ROW = ("orders", 1)
T = ("orders",)


def waiting(mgr: LockManager, resource: object) -> list[tuple[int, Mode]]:
    return [(i.owner, i.mode) for i in mgr.locks() if i.resource == resource and not i.granted]


def granted(mgr: LockManager, resource: object) -> set[tuple[int, Mode]]:
    return {(i.owner, i.mode) for i in mgr.locks() if i.resource == resource and i.granted}


def test_release_grants_only_what_the_queue_order_allows(mgr: LockManager) -> None:
    """X held; S, X, S queued: releasing X grants only the first S."""
    holder, s1, x2, s3 = (mgr.begin() for _ in range(4))
    holder.lock(ROW, X)
    a1 = Attempt(s1, s1.lock, ROW, S, timeout=5).queued()
    a2 = Attempt(x2, x2.lock, ROW, X, timeout=5).queued()
    a3 = Attempt(s3, s3.lock, ROW, S, timeout=5).queued()
    assert waiting(mgr, ROW) == [(s1.id, S), (x2.id, X), (s3.id, S)]

    holder.unlock(ROW)
    assert a1.join() is S
    assert not a2.settle() and not a3.done  # X waits for S; the last S may not pass the X
    assert granted(mgr, ROW) == {(s1.id, S)}
    assert waiting(mgr, ROW) == [(x2.id, X), (s3.id, S)]

    s1.unlock(ROW)
    assert a2.join() is X
    assert not a3.settle()
    x2.unlock(ROW)
    assert a3.join() is S


def test_a_compatible_newcomer_does_not_barge_past_a_waiter(mgr: LockManager) -> None:
    reader, writer, late = mgr.begin(), mgr.begin(), mgr.begin()
    reader.lock(ROW, S)
    w = Attempt(writer, writer.lock, ROW, X, timeout=5).queued()
    # S is compatible with the granted S, but not with the X waiting ahead of it
    with pytest.raises(LockTimeout) as err:
        late.lock(ROW, S, timeout=0)
    assert set(err.value.blockers) == {writer.id}
    reader.unlock(ROW)
    assert w.join() is X


def test_a_waiter_that_times_out_unblocks_the_ones_behind_it(mgr: LockManager) -> None:
    """S held, X waits 0.2 s, S behind it: the second S is granted when X gives up."""
    holder, writer, reader = mgr.begin(), mgr.begin(), mgr.begin()
    holder.lock(ROW, S)
    w = Attempt(writer, writer.lock, ROW, X, timeout=0.2).queued()
    r = Attempt(reader, reader.lock, ROW, S, timeout=5).queued()
    with pytest.raises(LockTimeout, match=r"could not get lock X on \('orders', 1\)") as err:
        w.join()
    assert err.value.blockers == (holder.id,)
    assert err.value.timeout == 0.2
    assert r.join() is S  # granted without any release
    assert granted(mgr, ROW) == {(holder.id, S), (reader.id, S)}
    # the writer's IX on the table, taken for this call, was given back
    assert writer.held(T) is None
    assert granted(mgr, T) == {(holder.id, IS), (reader.id, IS)}


def test_an_upgrade_waits_only_for_other_holders_and_goes_first(mgr: LockManager) -> None:
    """The upgrade queues after the granted locks, ahead of earlier waiters."""
    up, other, w1 = mgr.begin(), mgr.begin(), mgr.begin()
    up.lock(ROW, S)
    other.lock(ROW, S)
    a1 = Attempt(w1, w1.lock, ROW, X, timeout=5).queued()
    u = Attempt(up, up.lock, ROW, X, timeout=5).queued()
    assert waiting(mgr, ROW) == [(up.id, X), (w1.id, X)]
    assert up.held(ROW) is S  # keeps its S while it waits
    other.unlock(ROW)
    assert u.join() is X
    assert not a1.settle()
    up.unlock(ROW)
    assert a1.join() is X


def test_an_upgrade_is_granted_at_once_when_alone(mgr: LockManager) -> None:
    txn = mgr.begin()
    txn.lock(ROW, S)
    assert txn.lock(ROW, X, timeout=0) is X
    assert granted(mgr, ROW) == {(txn.id, X)}


def test_two_owners_upgrading_s_to_x_deadlock_and_one_proceeds(mgr: LockManager) -> None:
    """The second upgrade closes a cycle; it is refused, the first proceeds once it lets go."""
    a, b = mgr.begin(), mgr.begin()
    a.lock(ROW, S)
    b.lock(ROW, S)
    ua = Attempt(a, a.lock, ROW, X, timeout=5).queued()
    with pytest.raises(Deadlock) as err:
        b.lock(ROW, X, timeout=5)
    assert set(err.value.cycle) == {a.id, b.id}
    assert err.value.cycle[0] == b.id  # the victim first
    assert b.held(ROW) is S  # its granted lock stays until it releases
    assert not ua.settle()
    b.release_all()
    assert ua.join() is X


def test_a_failed_try_queues_nothing(mgr: LockManager) -> None:
    holder, other = mgr.begin(), mgr.begin()
    holder.lock(ROW, X)
    with pytest.raises(LockTimeout, match=r"\(a try\)"):
        other.lock(ROW, S, timeout=0)
    assert waiting(mgr, ROW) == []
    assert other.held(T) is None
    assert mgr.stats().waits == 0


def test_default_timeouts_by_class() -> None:
    """Defaults: 50 ms for rows and intention locks, 1.8 s for table-level S/SIX/X."""
    mgr = LockManager()
    assert (mgr.wait_timeout, mgr.max_wait_timeout) == (0.05, 0.6)
    assert (mgr.ddl_wait_timeout, mgr.max_ddl_wait_timeout) == (1.8, 7.2)
    holder, row_waiter, table_waiter = mgr.begin(), mgr.begin(), mgr.begin()
    holder.lock(ROW, X)
    started = time.monotonic()
    with pytest.raises(LockTimeout) as err:
        row_waiter.lock(ROW, S)
    assert err.value.timeout == 0.05
    assert time.monotonic() - started >= 0.05
    # A table-level S is in the DDL class; with a tiny DDL default we can
    # observe which default applied without waiting 1.8 s.
    quick = LockManager(ddl_wait_timeout=0.01)
    h, t = quick.begin(), quick.begin()
    h.lock(T, IX)
    with pytest.raises(LockTimeout) as err:
        t.lock(T, S)
    assert err.value.timeout == 0.01
    with pytest.raises(LockTimeout) as err:
        table_waiter.lock(T, X, timeout=0.01)
    assert err.value.timeout == 0.01


def test_a_timeout_above_its_maximum_is_refused_before_acquiring_anything() -> None:
    mgr = LockManager()
    txn = mgr.begin()
    with pytest.raises(LockUsageError, match=r"max_wait_timeout=0\.6"):
        txn.lock(ROW, X, timeout=0.7)
    with pytest.raises(LockUsageError, match=r"max_ddl_wait_timeout=7\.2"):
        txn.lock(T, X, timeout=8)
    assert mgr.locks() == []
    assert txn.lock(T, X, timeout=7.2) is X  # at the maximum is fine


def test_maxima_can_be_removed() -> None:
    mgr = LockManager(max_wait_timeout=None, max_ddl_wait_timeout=None)
    holder, waiter = mgr.begin(), mgr.begin()
    holder.lock(ROW, X)
    a = Attempt(waiter, waiter.lock, ROW, X, timeout=3600).queued()
    holder.unlock(ROW)
    assert a.join() is X
    assert mgr.begin().lock(("other",), X, timeout=None) is X


def test_a_txn_waits_for_one_thing_at_a_time(mgr: LockManager) -> None:
    holder, txn = mgr.begin(), mgr.begin()
    holder.lock(ROW, X)
    a = Attempt(txn, txn.lock, ROW, X, timeout=5).queued()
    with pytest.raises(LockUsageError, match="already waiting"):
        txn.lock(("orders", 2), X)
    with pytest.raises(LockUsageError, match="waiting for a lock in another thread"):
        txn.release_all()
    holder.unlock(ROW)
    assert a.join() is X


def test_stats_count_grants_waits_timeouts(mgr: LockManager) -> None:
    holder, waiter = mgr.begin(), mgr.begin()
    holder.lock(ROW, X)  # IX + X
    with pytest.raises(LockTimeout):
        waiter.lock(ROW, X, timeout=0.02)  # IX granted, X waits, times out
    stats = mgr.stats()
    assert (stats.grants, stats.waits, stats.timeouts) == (3, 1, 1)
    assert stats.wait_time >= 0.02


def test_wait_time_counts_waits_that_end_in_a_grant(mgr: LockManager) -> None:
    holder, waiter = mgr.begin(), mgr.begin()
    holder.lock(ROW, X)
    a = Attempt(waiter, waiter.lock, ROW, X, timeout=5).queued()
    time.sleep(0.03)
    holder.unlock(ROW)
    a.join()
    assert mgr.stats().wait_time >= 0.03
