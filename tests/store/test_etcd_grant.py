"""etcd's grant on release (the etcd backend's design note, "Grant on release"): what
it costs, and the waiter it hands the lock to. Its rules of who is let in are the shared
ones of `test_grant.py`."""

from __future__ import annotations

import time

import pytest

from lockwarden import connect
from lockwarden.store import Store
from tests.conftest import Background, wait_for


@pytest.fixture
def url(etcd_url: str) -> str:
    """These tests are etcd's alone: the shared `store` fixture opens this URL."""
    return etcd_url


def test_a_waiter_of_another_store_is_handed_the_lock_without_an_attempt(
    store: Store, url: str
) -> None:
    """The release writes the grant; the waiter's store sees it on its watch and hands the
    waiting thread the lock, with the grant's revision as its token."""
    with connect(url) as theirs, store.session(app_id="here") as s:
        held = theirs.session(app_id="holder").lock("handed")
        waiting = Background(lambda: s.lock("handed", timeout=20))
        wait_for(lambda: store.waiters("handed"), what="the waiter to queue")
        time.sleep(0.3)  # its attempts are made: it waits
        attempts = store.stats["attempts"]
        held.release()
        lock = waiting.result(timeout=10)
        assert [e.token for e in store.locks("handed")] == [lock.token]
        assert lock.token > held.token
        assert store.stats["handed"] == 1 and store.stats["attempts"] == attempts
        assert store.waiters("handed") == []


def test_a_release_is_one_transaction_while_nobody_waits_and_grants_in_one_more(
    store: Store, url: str
) -> None:
    """Nobody waiting: the release is conditional on that, one transaction. Somebody
    waiting: that transaction reads the queue instead, and a second one releases and
    grants. On a name this store has seen fought over, the queue is read first (a read,
    not a write), then the same second transaction. (The other side uses a store of its
    own, so that ``store.stats`` counts this side's calls alone.)"""
    with connect(url) as theirs, store.session(app_id="a") as a:
        b = theirs.session(app_id="b")
        held = a.lock("n")
        before = store.stats["statements"]
        held.release()
        assert store.stats["statements"] - before == 1
        held = a.lock("n")
        waiting = Background(lambda: b.lock("n", timeout=20))
        wait_for(lambda: store.waiters("n"), what="b to queue")
        before = store.stats["statements"]
        held.release()
        assert store.stats["statements"] - before == 2
        theirs_held = waiting.result(timeout=10)
        waiting = Background(lambda: a.lock("n", timeout=20))  # found taken: fought over
        wait_for(lambda: store.waiters("n"), what="a to queue")
        theirs_held.release()
        held = waiting.result(timeout=10)  # handed over: no attempt finds the name free
        assert "n" in store._backend._contended
        waiting = Background(lambda: b.lock("n", timeout=20))
        wait_for(lambda: store.waiters("n"), what="b to queue again")
        before = store.stats["statements"]
        held.release()
        assert store.stats["statements"] - before == 2  # the read, then the grant
        assert waiting.result(timeout=10).token > held.token


@pytest.mark.parametrize("second_holds", [False, True])
def test_a_hand_over_to_a_writer_wakes_the_waiters_behind_only_if_they_may_close_a_cycle(
    store: Store, url: str, second_holds: bool
) -> None:
    """A writer granted on release blocks everyone behind it: their stores are not woken
    for the release (the quiet mark), and the next release hands the lock on to them
    in turn. A waiter whose session holds a lock is woken all the same, so that its
    look runs the deadlock check a grant may call for (`test_grant.py` has the cycle)."""
    with connect(url) as first, connect(url) as second:
        holder = store.session(app_id="holder").lock("q")
        one, two = first.session(app_id="one"), second.session(app_id="two")
        if second_holds:
            two.lock("elsewhere")
        waiting_one = Background(lambda: one.lock("q", timeout=20))
        wait_for(lambda: len(store.waiters("q")) == 1, what="one to queue")
        waiting_two = Background(lambda: two.lock("q", timeout=20))
        wait_for(lambda: len(store.waiters("q")) == 2, what="two to queue")
        time.sleep(0.3)  # their attempts are made: they wait
        attempts = second.stats["attempts"]
        holder.release()
        granted = waiting_one.result(timeout=10)
        time.sleep(0.3)  # a wake-up would have sent two's store back to look by now
        looked = second.stats["attempts"] - attempts
        assert looked == (1 if second_holds else 0)
        assert first.stats["handed"] == 1
        granted.release()
        assert waiting_two.result(timeout=10).token > granted.token
        assert second.stats["handed"] == 1
