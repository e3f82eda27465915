"""Pokes between the processes of one machine: a datagram to the inbox of a waiter's store.

A store that waits binds a datagram socket in Linux's abstract namespace (no
file to create or clean up; it vanishes with its process), named by the random
tag that ends every session id the store makes. A release that lets a waiter of
this machine in sends the waiter's store ``"<request id> <token>"`` (granted
that token) or the request id alone (attempt again): `Wakeups.deliver` reads
either. SQLite pokes every waiter this way; PostgreSQL and MySQL poke the
waiters of the releaser's machine and reach the others by NOTIFY, resp. a
doorbell (store design note, "Waiting and wake-ups"). A poke is best effort:
each backend says what covers one that is never sent.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable, Iterator

from lockwarden.store import process
from lockwarden.store.attempt import Told
from lockwarden.store.backend import TAG_LENGTH
from lockwarden.store.wakeups import Wakeups, message

LOOK_EVERY = 1.0
"""How often (seconds) a waiter that releases of this machine may poke asks whether it was
granted (`Backend.look_every`): a poke is sent after the release commits, so a releaser
that dies or is cut off in between never sends it (design note, "Release")."""


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


def open_inbox(tag: str) -> socket.socket | None:
    """The bound, non-blocking inbox of the store tagged ``tag``; None where there can be
    none (another platform, or the name taken: then only the backend's other ways reach
    its waiters)."""
    address = _address(tag)
    if address is None:
        return None
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        inbox.bind(address)
    except OSError:
        inbox.close()
        return None
    inbox.setblocking(False)
    return inbox


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

    def poke(self, session_id: str, message: str) -> bool:
        """Send ``message`` to the inbox of the store that made ``session_id``: whether it
        went (not if that store has no inbox on this machine, or its inbox is full)."""
        address = _address(session_id[-TAG_LENGTH:])
        if address is None:
            return False
        try:
            self._socket.sendto(message.encode(), address)
        except OSError:
            return False
        return True

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
        elif not outbox.poke(session, message(request, tokens)):
            unreached.append((request, session, tokens))
    return unreached
