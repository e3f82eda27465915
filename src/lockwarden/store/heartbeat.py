"""One background thread per store that keeps every session of the store alive.

Each session is beaten on its own schedule (every TTL/3) with one statement,
whatever it holds. The thread only schedules; what a beat does is the
session's business (`Session._beat`).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Protocol


class Beating(Protocol):
    @property
    def _beat_due(self) -> float:
        """When (``time.monotonic``) the next beat is due."""

    def _beat(self) -> None:
        """Send one heartbeat (or act on a loss); must not raise."""


class Heartbeat:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._members: set[Beating] = set()
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, member: Beating) -> None:
        with self._cond:
            self._members.add(member)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="lockwarden-heartbeat", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def remove(self, member: Beating) -> None:
        with self._cond:
            self._members.discard(member)

    def poke(self) -> None:
        """Look at the schedule again now (a beat became due earlier than planned)."""
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                due = [m for m in self._members if m._beat_due <= now]
                if not due:
                    wake = min([m._beat_due for m in self._members], default=math.inf)
                    self._cond.wait(min(wake - now, 3600.0))
                    continue
            for member in due:
                member._beat()
