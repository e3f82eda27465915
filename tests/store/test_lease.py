"""The lease on the holder's own clock (`lockwarden.store.lease`): its arithmetic, the timer
that ends it whatever the heartbeat is doing, and the rule that a late renewal counts for
nothing. The same on every backend (the `store` fixture's four)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockwarden import LockLost
from lockwarden.store import Store, lease
from lockwarden.store.lease import LeaseTimer
from tests.conftest import Background, wait_for


@given(
    sent=st.floats(min_value=0, max_value=1e6),
    ttl=st.floats(min_value=0.1, max_value=86400),
    holder_rate=st.floats(min_value=1 - lease.DRIFT, max_value=1 + lease.DRIFT),
    server_rate=st.floats(min_value=1 - lease.DRIFT, max_value=1 + lease.DRIFT),
)
def test_the_local_deadline_leaves_the_holder_time_to_act_before_the_database_may(
    sent: float, ttl: float, holder_rate: float, server_rate: float
) -> None:
    """With clocks whose rates are off by at most DRIFT each way, the local deadline comes at
    least 9.7 % of the TTL of real time before the database may hand the locks on."""
    local = lease.deadline(sent, ttl) - sent  # the holder's seconds until its deadline
    real_local = local / holder_rate  # a slow holder clock: its seconds are longer
    real_database = ttl / server_rate  # the database counts the TTL from its stamp (>= sent)
    assert real_database - real_local >= ttl * 0.097


class Member:
    def __init__(self, deadline: float) -> None:
        self._lease_deadline = deadline
        self.ended: list[float] = []

    def _lease_ended(self) -> None:
        self.ended.append(lease.now())
        self._lease_deadline = math.inf


def test_the_timer_ends_each_lease_at_its_deadline_and_not_before() -> None:
    timer = LeaseTimer()
    now = lease.now()
    members = [Member(now + d) for d in (0.3, 0.1, 0.2)]
    moved = Member(now + 0.1)
    try:
        for member in [*members, moved]:
            timer.add(member)
        moved._lease_deadline = now + 0.4  # renewed: the timer looks again when it wakes
        wait_for(lambda: all(m.ended for m in [*members, moved]), timeout=5)
        for member, due in zip(members, (0.3, 0.1, 0.2), strict=True):
            assert now + due <= member.ended[0] < now + due + 0.5
        assert now + 0.4 <= moved.ended[0]
        assert all(len(m.ended) == 1 for m in [*members, moved])
    finally:
        timer.close()


def test_leases_are_judged_on_a_clock_that_counts_a_suspend() -> None:
    """Linux's CLOCK_BOOTTIME: the monotonic clock plus the time spent suspended."""
    if not hasattr(time, "CLOCK_BOOTTIME"):
        pytest.skip("no CLOCK_BOOTTIME on this system")
    before = time.monotonic()
    at = lease.now()
    after = time.monotonic()
    suspended = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
    assert before + suspended - 0.01 <= at <= after + suspended + 0.01


def test_a_removed_member_is_never_ended() -> None:
    timer = LeaseTimer()
    member = Member(lease.now() + 0.1)
    timer.add(member)
    timer.remove(member)
    time.sleep(0.3)
    timer.close()
    assert member.ended == []


def blocking(store: Store) -> tuple[threading.Event, Callable[[], None]]:
    """Make the store's heartbeat statement hang until the event is set (a partition that
    holds the heartbeat thread, with nothing else of the store cut off)."""
    backend = store._backend
    release = threading.Event()
    heartbeat = backend.heartbeat

    def held_up(session: str) -> list[dict[str, object]]:
        release.wait(30)
        return heartbeat(session)

    backend.heartbeat = held_up  # type: ignore[method-assign]

    def restore() -> None:
        release.set()
        backend.heartbeat = heartbeat  # type: ignore[method-assign]

    return release, restore


def test_a_session_whose_heartbeat_hangs_is_lost_at_its_deadline(store: Store) -> None:
    told: list[float] = []
    session = store.session("hung", ttl=1.5, on_lost=lambda exc: told.append(time.monotonic()))
    held = session.lock("job")
    opened = time.monotonic()
    _, restore = blocking(store)
    try:
        wait_for(lambda: told, timeout=3, what="on_lost")
        assert told[0] - opened <= 1.5 * (1 - lease.MARGIN) + 0.3
        assert session.lost and session.lease_left == 0.0
        with pytest.raises(LockLost):
            held.check()
    finally:
        restore()
    time.sleep(0.3)  # the held-up heartbeat gets its answer now: it revives nothing
    assert session.lost
    with pytest.raises(LockLost):
        session.renew()
    session.close()
    assert len(told) == 1


def test_a_grant_that_arrives_after_the_lease_ran_out_is_given_back(store: Store) -> None:
    """A waiter paused past its lease gets its grant as it resumes, before its lease timer
    has had a chance to run: the lock call must not return a lock that is worth nothing."""
    holder = store.session("holder")
    held = holder.lock("job")
    waiter = store.session("waiter", ttl=30)
    waiting = Background(lambda: waiter.lock("job", timeout=20))
    wait_for(lambda: store.waiters("job"), what="the waiter to queue")
    store._leases.remove(waiter)  # as in a paused process: its timer does not run
    waiter._deadline = lease.now()  # its lease has run out on its own clock
    held.release()
    with pytest.raises(LockLost):
        waiting.result()
    assert waiter.lost
    wait_for(lambda: not [e for e in store.locks("job") if not e.stale], what="the give-back")
    waiter.close()
    holder.close()
