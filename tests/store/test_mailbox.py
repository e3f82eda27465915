"""A waiting thread's mailbox (`inbox.MailboxSubscription`): a release of this machine
pokes the thread itself, not its store's listening thread, which would then wake it."""

from __future__ import annotations

import errno
import secrets
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import lockwarden
from lockwarden.store import inbox
from lockwarden.store.backend import TAG_LENGTH
from lockwarden.store.validate import MAX_WAIT
from lockwarden.store.wakeups import Subscription
from tests.conftest import Background, wait_for

pytestmark = pytest.mark.skipif(
    not inbox.reachable(), reason="mailboxes live in Linux's abstract namespace"
)


def _request() -> str:
    return secrets.token_hex(16)


def _session(tag: str) -> str:
    return secrets.token_hex(16) + tag


@pytest.fixture
def outbox() -> Iterator[inbox.Outbox]:
    box = inbox.Outbox()
    yield box
    box.close()


def test_a_poke_reaches_the_waiting_thread_without_its_store_listening(
    outbox: inbox.Outbox,
) -> None:
    """The store's inbox is not even bound: the mailbox is all the poke needs."""
    request = _request()
    sub = inbox.MailboxSubscription.open(frozenset({"n"}), request)
    try:
        assert isinstance(sub, inbox.MailboxSubscription)
        assert outbox.poke(_session(secrets.token_hex(TAG_LENGTH // 2)), request, (5,))
        assert sub.wait(1.0) == (5,)
    finally:
        sub.close()


def test_a_poke_for_a_request_without_a_mailbox_goes_to_its_stores_inbox(
    outbox: inbox.Outbox,
) -> None:
    """An asyncio waiter, a thread that has not started waiting, an older client: its
    store's listening thread reads the poke."""
    tag, request = secrets.token_hex(TAG_LENGTH // 2), _request()
    box = inbox.open_inbox(tag)
    assert box is not None
    try:
        assert outbox.poke(_session(tag), request, (3,))
        wait_for(lambda: list(inbox.drain([box])) == [f"{request} 3".encode()], what="the poke")
        sub = inbox.MailboxSubscription.open(frozenset({"n"}), request)
        sub.close()  # a mailbox that is gone sends the poke to the inbox again
        assert outbox.poke(_session(tag), request, None)
        wait_for(lambda: list(inbox.drain([box])) == [request.encode()], what="the poke")
    finally:
        box.close()
    assert not outbox.poke(_session(tag), request, None)  # neither is bound


def test_a_thread_that_cannot_have_a_mailbox_waits_on_a_plain_subscription(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Out of file descriptors (or the name taken): the lock call goes on, its poke goes to
    the store's inbox."""

    def exhausted(*args: object) -> socket.socket:
        raise OSError(errno.EMFILE, "Too many open files")

    with monkeypatch.context() as patch:
        patch.setattr(socket, "socket", exhausted)
        sub = inbox.MailboxSubscription.open(frozenset({"n"}), _request())
    assert type(sub) is Subscription
    request = _request()
    taken = inbox.MailboxSubscription.open(frozenset({"n"}), request)
    try:
        assert type(inbox.MailboxSubscription.open(frozenset({"n"}), request)) is Subscription
    finally:
        taken.close()


def test_a_mailbox_is_not_named_by_its_request_id() -> None:
    """Abstract socket names are public, and a request id authorizes its release."""
    request = _request()
    sub = inbox.MailboxSubscription.open(frozenset({"n"}), request)
    try:
        with open("/proc/net/unix") as sockets:
            listed = sockets.read()
        assert "lockwarden-r-" in listed
        assert request not in listed
    finally:
        sub.close()


def test_a_message_for_another_request_only_makes_the_waiter_look_again(
    outbox: inbox.Outbox,
) -> None:
    """Anyone on the machine can write to a mailbox: without the request id, a message
    grants nothing."""
    request = _request()
    sub = inbox.MailboxSubscription.open(frozenset({"n"}), request)
    assert isinstance(sub, inbox.MailboxSubscription)
    try:
        forger = inbox.Outbox()
        address = inbox._mailbox(request)
        assert address is not None
        forger._socket.sendto(b"not-the-request 9", address)
        forger.close()
        assert sub.wait(1.0) is True
    finally:
        sub.close()


def test_a_ring_left_over_from_a_consumed_wake_up_does_not_end_a_wait() -> None:
    """`notify` sets the flag, then rings: a wait that saw the flag before the ring came
    leaves the ring for the next wait, which must not take it for a wake-up."""
    request = _request()
    sub = inbox.MailboxSubscription.open(frozenset({"n"}), request)
    try:
        address = inbox._mailbox(request)
        assert address is not None
        ringer = inbox.Outbox()
        ringer._socket.sendto(b"", address)
        ringer.close()
        started = time.monotonic()
        assert sub.wait(0.1) is False
        assert time.monotonic() - started >= 0.09
    finally:
        sub.close()


def test_a_wake_up_from_another_thread_ends_the_poll_and_none_comes_after_close() -> None:
    sub = inbox.MailboxSubscription.open(frozenset({"n"}), _request())
    try:
        threading.Timer(0.05, sub.notify).start()
        started = time.monotonic()
        assert sub.wait(5.0) is True
        assert time.monotonic() - started < 2.5
    finally:
        sub.close()
    sub.notify()  # from a thread late to the party: nothing to ring, no error


def test_a_wait_as_long_as_a_thread_can_wait_is_polled_in_parts() -> None:
    """`select.poll` takes at most 2**31 - 1 ms; a waiter's time is clamped to
    `validate.MAX_WAIT`, far beyond."""
    sub = inbox.MailboxSubscription.open(frozenset({"n"}), _request())
    try:
        threading.Timer(0.05, sub.notify).start()
        assert sub.wait(MAX_WAIT) is True
    finally:
        sub.close()


@pytest.mark.parametrize("backend", ["pg_url", "mysql_url", "sqlite_url"])
def test_a_hand_off_pokes_the_waiting_thread_not_its_stores_listener(
    request: pytest.FixtureRequest, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter's store (another store: the release pokes it) hears nothing through its
    listening thread, and the waiter wakes holding the lock, without an attempt."""
    url = request.getfixturevalue(backend)
    store, other = lockwarden.connect(url), lockwarden.connect(url)
    heard: list[str] = []
    monkeypatch.setattr(other._backend.wakeups, "deliver", heard.append)
    try:
        with store.session(app_id="a") as a, other.session(app_id="b") as b:
            held = a.lock("mailbox")
            waiting = Background(lambda: b.lock("mailbox", timeout=30))
            wait_for(lambda: other._backend.wakeups.waiting, what="the waiter to wait")
            attempts = other.stats["attempts"]
            held.release()
            lock = waiting.result(timeout=10)
            assert other.stats["attempts"] == attempts
            assert [e.token for e in store.locks("mailbox")] == [lock.token]
            assert heard == []
            lock.release()
    finally:
        store.close()
        other.close()
