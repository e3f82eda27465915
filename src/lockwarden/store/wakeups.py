"""Wake-ups for waiters in this process (design note, "Waiting and wake-ups").

A waiter subscribes to the names it waits for *before* its first attempt. A
wake-up sets a flag that the next wait consumes, so a release committed
between an attempt and the wait is not lost: the wait returns at once and
the waiter looks again.

Where wake-ups come from is the backend's business: PostgreSQL's LISTEN
connection, SQLite's in-process releases and its ``data_version`` poller.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress


class Subscription:
    """One waiter's interest in some names, waited on from a thread."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self._event = threading.Event()

    def notify(self) -> None:
        self._event.set()

    def wait(self, timeout: float | None) -> None:
        """Return when woken (or at once if woken since the last wait), or after ``timeout``."""
        self._event.wait(timeout)
        self._event.clear()


class AsyncSubscription(Subscription):
    """A subscription waited on from an event loop; wake-ups arrive from other threads."""

    def __init__(self, names: frozenset[str], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(names)
        self._loop = loop
        self._async_event = asyncio.Event()

    def notify(self) -> None:
        super().notify()
        with suppress(RuntimeError):  # the loop has closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._async_event.set)

    async def wait_async(self, timeout: float | None) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(self._async_event.wait(), timeout)
        self._async_event.clear()
        self._event.clear()


class Wakeups:
    """Who in this process waits for which names."""

    def __init__(self, watch: Callable[[], None]) -> None:
        self._watch = watch
        self._lock = threading.Lock()
        self._by_name: dict[str, set[Subscription]] = {}
        self._count = 0

    @contextmanager
    def subscribe(self, sub: Subscription) -> Iterator[Subscription]:
        """Register ``sub`` for its names while the block runs.

        The backend's source of wake-ups from other processes is running
        before this returns.
        """
        self._watch()
        with self._lock:
            self._count += 1
            for name in sub.names:
                self._by_name.setdefault(name, set()).add(sub)
        try:
            yield sub
        finally:
            with self._lock:
                self._count -= 1
                for name in sub.names:
                    subs = self._by_name[name]
                    subs.discard(sub)
                    if not subs:
                        del self._by_name[name]

    @property
    def waiting(self) -> int:
        """How many subscriptions are open."""
        return self._count

    def wake(self, names: Iterable[str]) -> None:
        with self._lock:
            subs = {sub for name in names for sub in self._by_name.get(name, ())}
        for sub in subs:
            sub.notify()

    def wake_all(self) -> None:
        with self._lock:
            subs = {sub for group in self._by_name.values() for sub in group}
        for sub in subs:
            sub.notify()
