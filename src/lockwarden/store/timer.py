"""A thread that acts on each of its members when the member's own time comes.

The heartbeat (`heartbeat.Heartbeat`: a beat when one is due) and the lease
timer (`lease.LeaseTimer`: a loss when a lease runs out) are both this loop
with a different question and action; a member whose time will not come again
answers infinity. The thread sleeps until the earliest time it knows of; a
time that moved later is looked at again when it wakes, one that comes
earlier must `poke` it (adding a member does).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Generic, TypeVar

M = TypeVar("M")


class Timer(Generic[M]):
    """One daemon thread per instance, started with the first member."""

    name = "lockwarden-timer"
    """The thread's name."""
    longest = 3600.0
    """The longest the thread sleeps without looking (seconds of `time.monotonic`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._members: set[M] = set()
        self._closed = False
        self._thread: threading.Thread | None = None

    def _now(self) -> float:
        """The clock the members' times are on."""
        return time.monotonic()

    def _due(self, member: M) -> float:
        """When ``member``'s time comes next (infinity: not again)."""
        raise NotImplementedError

    def _act(self, member: M) -> None:
        """What the thread does when ``member``'s time has come; must not raise."""
        raise NotImplementedError

    def add(self, member: M) -> None:
        with self._cond:
            self._members.add(member)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def remove(self, member: M) -> None:
        with self._cond:
            self._members.discard(member)

    def poke(self) -> None:
        """Look at the members' times again now (one came earlier than planned)."""
        with self._cond:
            self._cond.notify()

    def close(self, wait: float = 5.0) -> None:
        """Stop the thread, waiting up to ``wait`` seconds for an action under way."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=wait)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = self._now()
                ready = [m for m in self._members if self._due(m) <= now]
                if not ready:
                    wake = min((self._due(m) for m in self._members), default=math.inf)
                    self._cond.wait(min(wake - now, self.longest))
                    continue
            for member in ready:
                self._act(member)
