"""The thread that brings a database's wake-ups to a store's waiters.

PostgreSQL (its LISTEN connection), MySQL (its doorbell) and SQLite (its
``data_version`` poller) each keep one thread per waiting store, which reads
that source and the store's inbox (`inbox`) and hands each message to the
waiters it concerns (`Wakeups`). What the three share is here: the thread
starts at the store's first wait, with the inbox bound before it, so that a
poke sent after the waiter's first attempt waits to be read; that wait lasts
until the source has been tried (SQLite's file at once), and no longer than
the waiter's time left; a thread that stops leaves the next wait to start
another. How the thread reads its source, and when it stops (SQLite's never
does before its store closes), is each backend's; what it does when the source
fails (`Listener.failed`: waiters poll, backing off with jitter) is shared.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from lockwarden import hooks
from lockwarden.store import inbox
from lockwarden.store.backends.base import STORE_LOG, Stats
from lockwarden.store.retry import jittered
from lockwarden.store.wakeups import Wakeups

POLL_FALLBACK = 1.0
"""Waiters look at least this often (before jitter) while a listener has no source."""


class Listener:
    """One store's listening thread, started on demand (`Backend._watch`)."""

    def __init__(
        self,
        tag: str,
        run: Callable[[], None],
        name: str,
        *,
        pokes: bool,
        wakeups: Wakeups,
        stats: Stats,
    ) -> None:
        self._tag = tag
        self._run = run
        self._name = name
        self._pokes = pokes
        self._wakeups = wakeups
        self._stats = stats
        self.inbox: socket.socket | None = None
        """Where releases of this machine poke the store's waiters (None: not bound, or
        ``pokes`` false: no release can reach this store that way)."""
        self.tried = threading.Event()
        """Set by the thread once its source was tried: in force, or failed (then waiters
        poll). A waiter must not make its first attempt before, or a release committed in
        between would go unheard."""
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self, timeout: float | None) -> None:
        """Start the thread if none runs, and wait for its source to be tried, at most
        ``timeout`` seconds (the waiter's time left; None: without limit). A source may
        take long to come (a connection up to its ``connect_timeout``, a row locked by
        another transaction): the waiter's own timeout is kept."""
        if self.tried.is_set():
            return
        with self._lock:
            if self._thread is None:
                self.inbox = inbox.open_inbox(self._tag) if self._pokes else None
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self.tried.wait(timeout)

    def failed(self, failures: int, warning: str) -> float:
        """The source failed, ``failures`` times in a row before this one: every waiter
        looks now (a refused or dropped source slows waiters down but fails none of
        them: one granted meanwhile finds its grant when it looks), and again after the
        pause returned (doubling from 0.1 s, with jitter, up to `POLL_FALLBACK`), when the
        thread tries the source again. ``warning`` is logged for the first failure only."""
        if failures == 0:
            hooks.logger(STORE_LOG).warning("%s", warning)
        self.tried.set()
        self._stats.add("listener_reconnects")
        self._wakeups.wake_all()
        return jittered(min(0.05 * 2 ** (failures + 1), POLL_FALLBACK))

    def hand_on(self, ready: list[socket.socket]) -> None:
        """Hand each poke waiting in ``ready`` (the inbox, or sockets of the thread's own)
        to the waiter it names; an empty datagram only woke the thread."""
        for message in inbox.drain(ready):
            if message:
                self._wakeups.deliver(message.decode(errors="replace"))

    @property
    def started(self) -> bool:
        """Whether a thread was started and has not stopped."""
        return self._thread is not None

    def stopped(self) -> None:
        """Called by the thread as it ends for good: the next `start` starts another,
        which binds the inbox again and is waited for."""
        with self._lock:
            if self.inbox is not None:
                self.inbox.close()
                self.inbox = None
            self._thread = None
            self.tried.clear()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the thread to end; whether it has (or none ran)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the thread to end (the backend has told it to), and
        close the inbox — not under a thread still reading it."""
        if self.join(timeout) and self.inbox is not None:
            self.inbox.close()
