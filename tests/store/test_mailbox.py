"""A waiter's mailbox (`inbox.MailboxSubscription`, `aio.AsyncSubscription`): a release of
this machine pokes the waiting thread or event loop itself, not its store's listening
thread, which would then wake it."""

from __future__ import annotations

import asyncio
import errno
import secrets
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import lockwarden
from lockwarden.store import Session, Store, inbox
from lockwarden.store.aio import AsyncSubscription
from lockwarden.store.backends.base import TAG_LENGTH
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
    """A waiter that has not started waiting, an older client: its
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


def _spy(monkeypatch: pytest.MonkeyPatch, store: Store) -> tuple[list[str], list[str]]:
    """What reaches ``store``'s waiters through its listening thread (`Wakeups.deliver`:
    nothing is delivered), and what its waiters read from their mailboxes
    (`Subscription.heard`), as they come."""
    delivered: list[str] = []
    heard: list[str] = []
    monkeypatch.setattr(store._backend.wakeups, "deliver", delivered.append)
    hear = Subscription.heard

    def spying(sub: Subscription, message: str) -> None:
        heard.append(message)
        hear(sub, message)

    monkeypatch.setattr(Subscription, "heard", spying)
    return delivered, heard


def _listening(holder: Session, waiter: Session) -> None:
    """Start the wake-ups of ``waiter``'s store by one wait that times out. A store's first
    wait looks again once its wake-ups are in force (one might have been missed), and
    that look could find a grant before its poke is read."""
    held = holder.lock("gate")
    with pytest.raises(lockwarden.LockTimeout):
        waiter.lock("gate", timeout=0.05)
    held.release()


@pytest.mark.parametrize("backend", ["pg_url", "mysql_url", "sqlite_url"])
def test_a_hand_off_pokes_the_waiting_thread_not_its_stores_listener(
    request: pytest.FixtureRequest, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter's store (another store: the release pokes it) hears nothing through its
    listening thread, and the waiter's mailbox brings it its grant: it wakes holding the
    lock, without an attempt."""
    url = request.getfixturevalue(backend)
    store, other = lockwarden.connect(url), lockwarden.connect(url)
    delivered, heard = _spy(monkeypatch, other)
    try:
        with store.session(app_id="a") as a, other.session(app_id="b") as b:
            _listening(a, b)
            held = a.lock("mailbox")
            waiting = Background(lambda: b.lock("mailbox", timeout=30))
            wait_for(lambda: other._backend.wakeups.waiting, what="the waiter to wait")
            handed = other.stats["handed"]
            held.release()
            lock = waiting.result(timeout=10)
            assert [e.token for e in store.locks("mailbox")] == [lock.token]
            assert heard == [f"{lock.id} {lock.token}"]
            assert delivered == []
            assert other.stats["handed"] == handed + 1  # woken holding it: no attempt
            lock.release()
    finally:
        store.close()
        other.close()


# -- an asyncio task's mailbox, read by its event loop (`aio.AsyncSubscription`) -------


def test_a_poke_reaches_a_waiting_task_through_its_event_loop(outbox: inbox.Outbox) -> None:
    """The loop reads the mailbox: the grant arrives with no thread in between, and a
    message for another request only makes the task look again."""

    async def main() -> None:
        request = _request()
        sub = AsyncSubscription.open(frozenset({"n"}), request, pokes=True)
        try:
            assert outbox.poke(_session(secrets.token_hex(TAG_LENGTH // 2)), request, (7,))
            assert await sub.wait_async(5.0) == (7,)
            address = inbox._mailbox(request)
            assert address is not None
            outbox._socket.sendto(b"not-the-request 9", address)
            assert await sub.wait_async(5.0) is True
            assert await sub.wait_async(0.05) is False
        finally:
            sub.close()
        # The mailbox is gone, and the loop no longer watches it.
        assert not outbox.poke(_session(secrets.token_hex(TAG_LENGTH // 2)), request, None)

    asyncio.run(main())


def test_a_task_has_no_mailbox_where_releases_do_not_poke_or_the_loop_cannot_watch_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not every event loop can watch a socket (`add_reader`): the task's pokes then go
    to its store's inbox, and no mailbox is left bound."""

    async def main() -> None:
        request = _request()
        sub = AsyncSubscription.open(frozenset({"n"}), request, pokes=False)
        assert sub._mailbox is None
        loop = asyncio.get_running_loop()

        def cannot(*args: object) -> None:
            raise NotImplementedError

        monkeypatch.setattr(loop, "add_reader", cannot)
        sub = AsyncSubscription.open(frozenset({"n"}), request, pokes=True)
        assert sub._mailbox is None
        # The mailbox it bound was closed again: the name is free.
        opened = inbox.open_mailbox(request)
        assert opened is not None
        opened[0].close()

    asyncio.run(main())


@pytest.mark.parametrize("backend", ["pg_url", "mysql_url", "sqlite_url"])
def test_a_hand_off_pokes_the_waiting_task_not_its_stores_listener(
    request: pytest.FixtureRequest, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a thread: the waiting task's store hears nothing through its listening
    thread, the task's mailbox brings it its grant (it wakes holding the lock, without an
    attempt), and the mailbox is closed once it holds it."""
    url = request.getfixturevalue(backend)
    store, other = lockwarden.connect(url), lockwarden.connect(url)
    delivered, heard = _spy(monkeypatch, other)

    async def main(a: Session, b: Session) -> None:
        held = a.lock("mailbox")
        waiting = asyncio.create_task(b.lock_async("mailbox", timeout=30))
        while not other._backend.wakeups.waiting:
            await asyncio.sleep(0.01)
        handed = other.stats["handed"]
        await asyncio.to_thread(held.release)
        lock = await asyncio.wait_for(waiting, 10)
        assert [e.token for e in store.locks("mailbox")] == [lock.token]
        assert heard == [f"{lock.id} {lock.token}"]
        assert delivered == []
        assert other.stats["handed"] == handed + 1  # woken holding it: no attempt
        opened = inbox.open_mailbox(lock.id)  # the task's mailbox was closed: its name is free
        assert opened is not None
        opened[0].close()
        lock.release()

    try:
        with store.session(app_id="a") as a, other.session(app_id="b") as b:
            _listening(a, b)
            asyncio.run(main(a, b))
    finally:
        store.close()
        other.close()
