"""Administrators' overrides: named as such, forced explicitly, logged and recorded."""

from __future__ import annotations

import logging

import pytest

from lockwarden import LockTimeout
from lockwarden.store import Store
from tests.conftest import Background, stop_heartbeat, wait_for


def test_release_all_takes_only_sessions_no_longer_alive(store: Store) -> None:
    running = store.session("billing", ttl=60)  # another deployment, still running
    crashed = store.session("billing", ttl=0.3)  # the last run, which died
    running.lock("kept")
    crashed.lock("gone")
    stop_heartbeat(crashed)
    wait_for(lambda: any(e.stale for e in store.locks("gone")), what="the crash to show")
    assert store.release_all("billing") == 1
    assert [e.name for e in store.locks()] == ["kept"]
    assert not running.lost
    [record] = store.admin_log()
    assert (record.action, record.subject) == ("release_all", "billing")
    assert record.detail == "locks released: 1"


def test_a_forced_release_all_takes_live_sessions_and_says_so(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    running = store.session("billing", ttl=3)  # beats every second
    running.lock("taken")
    with caplog.at_level(logging.INFO, logger="lockwarden"):
        assert store.release_all("billing", force=True) == 1
    assert "release_all 'billing'" in caplog.text and "(forced)" in caplog.text
    assert store.locks() == []
    assert "(forced)" in store.admin_log()[0].detail
    wait_for(lambda: running.lost, what="the forced session to learn it")


def test_raising_permits_while_held_waits_for_the_holders(store: Store) -> None:
    me, other = store.session("a"), store.session("b")
    held = me.lock("pool")
    raising = Background(lambda: store.set_permits("pool", write=2))
    wait_for(lambda: store.waiters("pool"), what="the raise to queue")
    assert store.waiters("pool")[0].app_id == "lockwarden-admin"  # visible in status
    assert other.try_lock("pool") is None  # the holder is still alone
    assert store.permits("pool").write == 1
    held.release()
    raising.result()
    assert store.permits("pool").write == 2
    with me.lock("pool"), other.lock("pool", timeout=5):
        pass
    assert "after the holders left" in store.admin_log()[0].detail


def test_a_raise_that_times_out_changes_nothing(store: Store) -> None:
    me = store.session("a")
    with me.lock("pool"):
        with pytest.raises(LockTimeout, match="permits of 'pool' unchanged"):
            store.set_permits("pool", read=3, write=3, timeout=0.2)
        assert store.permits("pool").write == 1
        assert store.waiters("pool") == []
        assert store.admin_log() == []


def test_a_forced_raise_applies_at_once_and_is_recorded(store: Store) -> None:
    me, other = store.session("a"), store.session("b")
    with me.lock("pool"):
        store.set_permits("pool", write=2, force=True)
        with other.lock("pool", timeout=0):
            pass
    assert "forced while held" in store.admin_log()[0].detail


def test_lowering_permits_or_a_free_name_needs_no_wait(store: Store) -> None:
    me = store.session("a")
    store.set_permits("free", write=3)  # nobody holds it
    with me.lock("free"):
        store.set_permits("free", write=1, timeout=0)  # lowering never lets anyone in
    assert store.permits("free").write == 1


def test_break_lock_is_recorded(store: Store) -> None:
    store.session("a").lock("stuck")
    assert store.break_lock("stuck") == 1
    [record] = store.admin_log()
    assert (record.action, record.subject, record.detail) == (
        "break_lock",
        "stuck",
        "1 holders removed",
    )
