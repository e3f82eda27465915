"""Pokes between the processes of one machine: a datagram to a waiter's mailbox, or to
the inbox of its store.

A thread that waits for a request binds a datagram socket of its own, its
mailbox, in Linux's abstract namespace (no file to create or clean up; it
vanishes with its process), named by a hash of the request id, and polls it
while it waits (`MailboxSubscription`). A store that waits binds one more, its
inbox, named by the random tag that ends every session id the store makes, read
by the store's listening thread. A release that lets a waiter of this machine
in sends ``"<request id> <token>"`` (granted that token) or the request id alone
(attempt again) to the request's mailbox, or where there is none (a waiter not
waiting yet, a client older than mailboxes) to its store's inbox:
`Subscription.heard`, resp. `Wakeups.deliver`, reads either. An asyncio task
that waits has a mailbox too, read by its event loop (`aio.AsyncSubscription`).
The mailbox spares a hand-off one thread hop: the poke wakes the waiting thread
(or loop) itself, not a listening thread that then wakes it (store design note,
"Waiting and wake-ups"). SQLite pokes every waiter this way; PostgreSQL and
MySQL poke the waiters of the releaser's machine and reach the others by
NOTIFY, resp. a doorbell. A poke is best effort: each backend says what covers
one that is never sent.
"""

from __future__ import annotations

import math
import select
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import suppress

from lockwarden.store import process
from lockwarden.store.backends.base import TAG_LENGTH
from lockwarden.store.wakeups import Subscription, Tokens, Told, Wakeups, Woken, message

LOOK_EVERY = 1.0
"""How often (seconds) a waiter that releases of this machine may poke asks whether it was
granted (`Backend.look_every`): a poke is sent after the release commits, so a releaser
that dies or is cut off in between never sends it (design note, "Release")."""


_LONGEST_POLL = 2**31 - 1
"""The longest `select.poll` waits at once (milliseconds, a C int): a longer wait, as long
as `validate.MAX_WAIT`, polls again."""


def reachable() -> bool:
    """Whether stores here have inboxes (Linux's abstract namespace)."""
    return sys.platform == "linux"


def near() -> str | None:
    """What begins the identity (`process.identity`) of every process whose stores a poke
    from here can reach: this machine, boot and pid namespace; None where stores have no
    inbox. A release pokes the waiters whose sessions' identities begin so."""
    here = process.machine() if reachable() else None
    return None if here is None else f"{here}/"


def _address(tag: str) -> bytes | None:
    """Where a store tagged ``tag`` receives pokes; None where stores have no inbox."""
    return b"\0lockwarden-" + tag.encode() if reachable() else None


def _mailbox(request_id: str) -> bytes | None:
    """Where the thread waiting for request ``request_id`` receives pokes; None where
    threads have no mailbox. Named by a hash: abstract socket names are public
    (``/proc/net/unix``), and the request id is the secret that authorizes its release."""
    if not reachable():
        return None
    import hashlib  # noqa: PLC0415  (only where someone waits: the command's start-up)

    digest = hashlib.blake2b(request_id.encode(), digest_size=12).hexdigest()
    return b"\0lockwarden-r-" + digest.encode()


def _bind(address: bytes) -> socket.socket | None:
    """A non-blocking datagram socket bound to ``address``; None if it is taken, or no socket
    can be had (the process is out of file descriptors: its waiters are then reached the
    other ways)."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def open_inbox(tag: str) -> socket.socket | None:
    """The bound, non-blocking inbox of the store tagged ``tag``; None where there can be
    none (another platform, or the name taken: then only the backend's other ways reach
    its waiters)."""
    address = _address(tag)
    return None if address is None else _bind(address)


def open_mailbox(request_id: str) -> tuple[socket.socket, bytes] | None:
    """The bound, non-blocking mailbox of request ``request_id``, and its address; None
    where there can be none (another platform, the name taken, no descriptor left: a
    poke then goes to the store's inbox)."""
    address = _mailbox(request_id)
    mailbox = None if address is None else _bind(address)
    return None if address is None or mailbox is None else (mailbox, address)


def read_mailbox(mailbox: socket.socket, sub: Subscription) -> None:
    """Hand every poke waiting in ``mailbox`` to the subscription that waits on it
    (`Subscription.heard`). An empty datagram is a ring: it only ends a poll, and the
    subscription's flag says why."""
    for data in drain([mailbox]):
        if data:
            sub.heard(data.decode(errors="replace"))


def drain(ready: list[socket.socket]) -> Iterator[bytes]:
    """Every datagram waiting in each of ``ready``, without blocking."""
    for sock in ready:
        while True:
            try:
                yield sock.recv(256)
            except BlockingIOError:
                break


class Outbox:
    """Sends pokes to the stores of other processes (one socket, shared by threads)."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)

    def poke(self, session_id: str, request_id: str, tokens: Tokens | None) -> bool:
        """Tell request ``request_id`` of session ``session_id`` what a release did (its
        ``tokens``; None: attempt again): at its mailbox, else at its store's inbox.
        Whether it went (not if neither is bound on this machine, or both are full)."""
        data = message(request_id, tokens).encode()
        for address in (_mailbox(request_id), _address(session_id[-TAG_LENGTH:])):
            if address is None:
                return False
            try:
                self._socket.sendto(data, address)
            except OSError:  # not bound (nobody reads it), or full
                continue
            return True
        return False

    def close(self) -> None:
        self._socket.close()


def tell(told: Iterable[Told], tag: str, wakeups: Wakeups, outbox: Outbox) -> list[Told]:
    """Tell each request ``(request id, session id, tokens)`` what a release did (the
    tokens it was granted; None: attempt again): a request of this store, whose session
    id ends with ``tag``, directly; one of another process by a poke to its store's
    inbox. Returns those whose poke could not be sent (the process is gone, or its inbox
    closed or full): the caller reaches them its other way, if it has one."""
    unreached: list[Told] = []
    for request, session, tokens in told:
        if session.endswith(tag):
            wakeups.address(request, tokens)
        elif not outbox.poke(session, request, tokens):
            unreached.append((request, session, tokens))
    return unreached


class MailboxSubscription(Subscription):
    """A subscription waited on from a thread that reads its request's mailbox itself.

    The thread polls the mailbox, which a release's poke reaches directly, and
    which `notify` rings (an empty datagram) for every other wake-up, so that
    one poll waits for both. The flag a wake-up sets stays the event of
    `Subscription`: a ring only ends the poll.
    """

    def __init__(
        self, names: frozenset[str], request_id: str, mailbox: socket.socket, address: bytes
    ) -> None:
        super().__init__(names, request_id)
        self._mailbox: socket.socket | None = mailbox
        self._address = address
        self._poll = select.poll()
        self._poll.register(mailbox, select.POLLIN)
        self._ring_lock = threading.Lock()
        """Held to ring and to close, so that a ring never goes to a descriptor the
        mailbox gave up (and the process reused meanwhile)."""

    @classmethod
    def open(cls, names: frozenset[str], request_id: str) -> Subscription:
        """A subscription with a mailbox bound for ``request_id``, or, where none can be
        (`open_mailbox`), a plain one: a poke then reaches the store's inbox, and its
        listening thread wakes the waiter."""
        opened = open_mailbox(request_id)
        if opened is None:
            return Subscription(names, request_id)
        return cls(names, request_id, *opened)

    def notify(self) -> None:
        super().notify()
        with self._ring_lock:
            if self._mailbox is not None:
                with suppress(OSError):  # full: a ring is pending anyway
                    self._mailbox.sendto(b"", self._address)

    def wait(self, timeout: float | None) -> Woken:
        deadline = None if timeout is None else time.monotonic() + timeout
        mailbox = self._mailbox
        assert mailbox is not None  # waited on only before `close`
        while not self._read(mailbox):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._poll.poll(None if left is None else min(math.ceil(left * 1000), _LONGEST_POLL))
        return self._woken()

    def _read(self, mailbox: socket.socket) -> bool:
        """Take in what the mailbox holds; whether a wake-up is pending (the event)."""
        read_mailbox(mailbox, self)
        return self._event.is_set()

    def close(self) -> None:
        with self._ring_lock:
            if self._mailbox is not None:
                self._mailbox.close()
                self._mailbox = None
