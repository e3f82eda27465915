"""Partitions: a holder cut off from its database stops by its own clock.

Each test cuts one client off with a proxy frozen into a blackhole (nothing
crosses, nothing answers, nothing is closed: `chaos.proxy`), on PostgreSQL,
MariaDB and a 3-member etcd cluster (its three client ports behind proxies),
while another client reaches the same store straight. What must hold (design
note, "Heartbeat and lost locks"; docs/operators.md, "Partitions"):

- the cut-off holder's ``on_lost`` fires within the TTL of the cut, and before
  the other client is granted the lock;
- ``owned()`` answers within the lease, and at once once it is lost;
- a heartbeat's reply that arrives after the lease ran out never revives it;
- every call ends within the store's call timeout.
"""

from __future__ import annotations

import threading
import time

import pytest

import lockwarden
from lockwarden import LockLost, StoreError
from tests.conftest import Partitionable, wait_for

pytestmark = pytest.mark.slow

TTL = 3.0


def test_a_cut_off_holder_learns_of_its_loss_before_the_lock_passes_on(
    partitionable: Partitionable,
) -> None:
    lost_at: list[float] = []
    told = threading.Event()

    def on_lost(exc: LockLost) -> None:
        lost_at.append(time.monotonic())
        told.set()

    with (
        lockwarden.connect(partitionable.far) as cut_off,
        lockwarden.connect(partitionable.near) as other,
    ):
        session = cut_off.session("cut-off", ttl=TTL, on_lost=on_lost)
        held = session.lock("job")
        time.sleep(0.3)  # a heartbeat or two in flight, as in real life
        cut = time.monotonic()
        partitionable.freeze()
        try:
            asked = time.monotonic()
            assert not held.owned()  # it cannot be confirmed: lost by the lease's end
            assert time.monotonic() - asked < TTL  # answered within the lease
            assert told.wait(TTL), "on_lost did not fire within the TTL of the cut"
            assert lost_at[0] - cut < TTL * 0.9 + 0.5
            assert session.lost
            asked = time.monotonic()
            assert not held.owned()  # lost: answered at once, without the database
            assert time.monotonic() - asked < 0.1
            with other.session("other", ttl=TTL) as taker:
                taken = taker.lock("job", timeout=20)
                granted = time.monotonic()
                assert lost_at[0] < granted  # the cut-off holder knew first
                taken.release()
        finally:
            partitionable.thaw()
        time.sleep(1.0)  # the heartbeat held up by the partition gets its reply now: too late
        assert session.lost
        with pytest.raises(LockLost):
            held.check()
        with pytest.raises(LockLost):
            held.release()  # nothing to release that still counts: no call made
        session.close()
        assert len(lost_at) == 1


def test_a_heartbeat_reply_after_the_lease_ran_out_does_not_revive_the_session(
    partitionable: Partitionable,
) -> None:
    with lockwarden.connect(partitionable.far) as store:
        session = store.session("late", ttl=TTL)
        session.lock("job")
        partitionable.freeze()
        try:
            wait_for(lambda: session.lost, timeout=TTL, what="the lease to run out")
        finally:
            partitionable.thaw()
        with pytest.raises(LockLost):
            session.renew()
        with pytest.raises(LockLost):
            session.lock("other", timeout=0)
        assert session.lease_left == 0.0
        session.close()


def test_calls_against_a_partitioned_database_end_within_the_call_timeout(
    partitionable: Partitionable,
) -> None:
    with lockwarden.connect(partitionable.far, call_timeout=2.0) as store:
        store.locks()
        partitionable.freeze()
        try:
            for call in (store.locks, store.clean, lambda: store.break_lock("job")):
                started = time.monotonic()
                with pytest.raises(StoreError, match="within"):
                    call()
                assert time.monotonic() - started < 2.0 + 1.5  # etcd: one request past
        finally:
            partitionable.thaw()
        assert store.locks() == []  # the store works again once the partition heals


def test_opening_a_store_behind_a_partition_fails_within_the_call_timeout(
    partitionable: Partitionable,
) -> None:
    partitionable.freeze()
    started = time.monotonic()
    with pytest.raises(StoreError):
        lockwarden.connect(partitionable.far)
    assert time.monotonic() - started < 10.0
