"""Wake-ups in one process: by name and by request, none lost before a waiter subscribes.

The contract of a subscription holds for both kinds a thread waits on: an event, and a
mailbox it polls (`inbox.MailboxSubscription`, where releases of this machine poke it)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator

import pytest

from lockwarden.store import inbox
from lockwarden.store.wakeups import Subscription, Wakeups, message, read

New = Callable[[frozenset[str], str], Subscription]


@pytest.fixture(params=["event", "mailbox"])
def new(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[New]:
    """Makes a subscription of one kind; a mailbox is closed after the test."""
    if request.param == "event":
        yield Subscription
        return
    if not inbox.reachable():
        pytest.skip("mailboxes live in Linux's abstract namespace")
    # Addresses are the machine's: another run of these tests must not take the same ones.
    named, salt = inbox._mailbox, secrets.token_hex(8)
    monkeypatch.setattr(inbox, "_mailbox", lambda request_id: named(request_id + salt))
    made: list[Subscription] = []

    def open_one(names: frozenset[str], request_id: str) -> Subscription:
        sub = inbox.MailboxSubscription.open(names, request_id)
        assert isinstance(sub, inbox.MailboxSubscription)
        made.append(sub)
        return sub

    yield open_one
    for sub in made:
        sub.close()


def _wakeups() -> Wakeups:
    return Wakeups(lambda timeout: None)


def test_a_grant_reaches_only_the_request_it_names(new: New) -> None:
    wakeups = _wakeups()
    mine, other = new(frozenset({"n"}), "r1"), new(frozenset({"n"}), "r2")
    for sub in (mine, other):
        wakeups.add(sub)
    wakeups.address("r1", (7,))
    assert mine.wait(0) == (7,)
    started = time.monotonic()
    assert other.wait(0.05) is False  # not woken: it waited its whole timeout
    assert time.monotonic() - started >= 0.04


def test_a_request_told_to_look_again_gets_no_tokens(new: New) -> None:
    wakeups = _wakeups()
    sub = new(frozenset({"n"}), "r1")
    wakeups.add(sub)
    wakeups.address("r1", None)
    started = time.monotonic()
    assert sub.wait(1.0) is True  # woken, with nothing granted
    assert time.monotonic() - started < 0.5  # woken at once


def test_wake_ups_before_the_subscription_are_replayed_from_the_attempt_on(new: New) -> None:
    """A waiter subscribes after its first attempt: what came for it since that attempt
    began is delivered when it subscribes; a name's wake-up from before is not."""
    wakeups = _wakeups()
    wakeups.wake(["old"])
    since = time.monotonic()
    wakeups.address("r1", (9,))
    late = new(frozenset({"n"}), "r1")
    wakeups.add(late, since)
    assert late.wait(0) == (9,)

    wakeups.wake(["n"])
    named = new(frozenset({"n"}), "r2")
    wakeups.add(named, since)
    started = time.monotonic()
    assert named.wait(1.0) is True
    assert time.monotonic() - started < 0.5  # woken by the replayed wake-up

    stale = new(frozenset({"old"}), "r3")
    wakeups.add(stale, since)
    started = time.monotonic()
    assert stale.wait(0.05) is False
    assert time.monotonic() - started >= 0.04  # "old" was woken before the attempt began


def test_a_waiter_looks_again_if_wake_ups_may_have_been_missed(new: New) -> None:
    wakeups = _wakeups()
    epoch = wakeups.epoch
    wakeups.wake_all()  # e.g. the listener (re)connected: notifications may be lost
    sub = new(frozenset({"n"}), "r1")
    wakeups.add(sub, time.monotonic(), epoch)
    started = time.monotonic()
    assert sub.wait(1.0) is True
    assert time.monotonic() - started < 0.5


def test_removing_is_idempotent_and_forgets_the_request(new: New) -> None:
    wakeups = _wakeups()
    sub = new(frozenset({"n"}), "r1")
    wakeups.add(sub)
    assert wakeups.waiting == 1
    wakeups.remove(sub)
    wakeups.remove(sub)
    assert wakeups.waiting == 0
    wakeups.address("r1", (1,))  # remembered for a later subscriber, not delivered to sub
    assert sub.wait(0) is False


def test_a_subscription_cut_short_by_ctrl_c_is_removed_all_the_same() -> None:
    """Ctrl-C as `add` wakes a new subscriber for its first name: the rest of its names
    were never registered, and `remove` (run on the way out) leaves them be, rather
    than fail with a KeyError in place of the KeyboardInterrupt."""

    class Interrupted(Subscription):
        def notify(self) -> None:
            raise KeyboardInterrupt

    wakeups = _wakeups()
    wakeups.wake(["a", "b"])
    sub = Interrupted(frozenset({"a", "b"}), "r1")
    with pytest.raises(KeyboardInterrupt):
        wakeups.add(sub, since=0.0)
    wakeups.remove(sub)
    assert wakeups.waiting == 0


def test_the_first_waiter_looks_again_once_the_source_of_wake_ups_has_started(new: New) -> None:
    """Before the first wait of a store nothing listens to other processes: a release
    between that waiter's attempt and the start of the listener went unheard."""
    started: list[bool] = []
    wakeups = Wakeups(lambda timeout: started.append(True))
    epoch = wakeups.epoch  # read before the first attempt
    sub = new(frozenset({"n"}), "r1")
    wakeups.add(sub, time.monotonic(), epoch)
    assert started
    t0 = time.monotonic()
    assert sub.wait(1.0) is True
    assert time.monotonic() - t0 < 0.5
    later = new(frozenset({"n"}), "r2")
    wakeups.add(later, time.monotonic(), wakeups.epoch)  # the source was running already
    t0 = time.monotonic()
    assert later.wait(0.05) is False
    assert time.monotonic() - t0 >= 0.04


def test_the_source_stops_only_once_nobody_has_waited_for_the_idle_time() -> None:
    stops: list[bool] = []
    wakeups = Wakeups(lambda timeout: None)
    sub = Subscription(frozenset({"n"}), "r1")
    wakeups.add(sub, time.monotonic(), wakeups.epoch)
    assert not wakeups.unwatch(0.0, lambda: stops.append(True))  # someone waits
    wakeups.remove(sub)
    assert not wakeups.unwatch(60.0, lambda: stops.append(True))  # not idle long enough
    assert stops == []
    assert wakeups.unwatch(0.0, lambda: stops.append(True))
    assert stops == [True]


def test_a_source_that_stopped_makes_the_next_waiter_look_again() -> None:
    """What came while nobody listened is lost, as before the first wait of a store."""
    starts: list[bool] = []
    wakeups = Wakeups(lambda timeout: starts.append(True))
    wakeups.add(first := Subscription(frozenset({"n"}), "r1"), time.monotonic(), wakeups.epoch)
    assert first.wait(0) is True  # the store's first waiter
    wakeups.remove(first)
    assert wakeups.unwatch(0.0, lambda: None)
    epoch = wakeups.epoch  # read before the next waiter's first attempt
    wakeups.add(sub := Subscription(frozenset({"n"}), "r2"), time.monotonic(), epoch)
    assert len(starts) == 2  # the source was asked to start again
    assert sub.wait(0) is True


def test_the_source_never_stops_between_starting_and_a_subscription() -> None:
    """`add` starts the source, then subscribes: a stop between the two would leave the
    waiter subscribed to a source that no longer runs, unheard until its timeout."""
    refused: list[bool] = []
    wakeups: Wakeups

    def watch(timeout: float | None) -> None:
        # The source is running; the waiter is not subscribed yet.
        refused.append(not wakeups.unwatch(0.0, lambda: None))

    wakeups = Wakeups(watch)
    wakeups.add(Subscription(frozenset({"n"}), "r1"), time.monotonic(), wakeups.epoch)
    assert refused == [True]


def test_an_add_that_fails_to_start_the_source_does_not_keep_it_from_stopping() -> None:
    def watch(timeout: float | None) -> None:
        raise KeyboardInterrupt

    wakeups = Wakeups(watch)
    with pytest.raises(KeyboardInterrupt):
        wakeups.add(Subscription(frozenset({"n"}), "r1"), time.monotonic(), wakeups.epoch)
    assert wakeups.unwatch(0.0, lambda: None)


def test_a_message_reads_back_as_written_and_anything_else_as_a_look_again() -> None:
    """One format for pokes and PostgreSQL's NOTIFY, written by `message`, read by `read`."""
    assert read(message("r1", (42,))) == ("r1", (42,))
    assert read(message("r1", None)) == ("r1", None)
    for stray in ("r1 42x", "r1 -1", "r1 \uff14\uff12", "r1 "):
        assert read(stray) == ("r1", None)
