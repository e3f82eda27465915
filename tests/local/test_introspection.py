"""Snapshots, the waits-for graph and counters."""

from __future__ import annotations

import time

from lockwarden import LockManager, Mode
from lockwarden.local import LockInfo
from tests.local.conftest import Attempt

S, X, IS = Mode.S, Mode.X, Mode.IS
ROW = ("orders", 1)


def test_snapshot_lists_granted_and_waiting_with_times(mgr: LockManager) -> None:
    before = time.monotonic()
    holder, waiter = mgr.begin(), mgr.begin()
    holder.lock(ROW, S)
    a = Attempt(waiter, waiter.lock, ROW, X, timeout=5).queued()
    snap = {(i.resource, i.owner, i.mode, i.granted): i for i in mgr.locks()}
    assert set(snap) == {
        (("orders",), holder.id, IS, True),
        (ROW, holder.id, S, True),
        (("orders",), waiter.id, Mode.IX, True),
        (ROW, waiter.id, X, False),
    }
    assert all(before <= i.since <= time.monotonic() for i in snap.values())
    assert snap[(ROW, waiter.id, X, False)].kind == "data"
    assert mgr.waits_for() == {waiter.id: {holder.id}}
    holder.release_all()
    a.join()
    assert mgr.waits_for() == {}


def test_an_upgrade_appears_as_held_and_as_waiting(mgr: LockManager) -> None:
    up, other = mgr.begin(), mgr.begin()
    up.lock(ROW, S)
    other.lock(ROW, S)
    a = Attempt(up, up.lock, ROW, X, timeout=5).queued()
    row_entries = [(i.owner, i.mode, i.granted) for i in mgr.locks() if i.resource == ROW]
    assert sorted(row_entries, key=str) == sorted(
        [(up.id, S, True), (other.id, S, True), (up.id, X, False)], key=str
    )
    other.release_all()
    a.join()


def test_lock_info_is_a_plain_value() -> None:
    info = LockInfo(("t",), 1, S, True, 0.0)
    assert info.kind == "data"
    assert info == LockInfo(("t",), 1, S, True, 0.0)


def test_a_solo_lock_keeps_its_grant_time_when_contention_arrives(mgr: LockManager) -> None:
    holder, waiter = mgr.begin(), mgr.begin()
    holder.lock(ROW, X)
    (granted_at,) = [i.since for i in mgr.locks() if i.resource == ROW]
    time.sleep(0.01)
    a = Attempt(waiter, waiter.lock, ROW, X, timeout=5).queued()  # builds the queue
    (still,) = [i.since for i in mgr.locks() if i.resource == ROW and i.granted]
    assert still == granted_at
    holder.release_all()
    a.join()
