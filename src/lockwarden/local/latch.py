"""A read/write latch for short critical sections.

A latch is what an MVCC engine puts around the few instructions that read or
change a record in place; the transaction-length protection comes from
versions, not from locks. So, unlike a lock in the manager, a latch keeps no
record of who holds it (two counters and a flag), has no upgrades, no
deadlock detection and no timeouts by default: holders are expected to leave
within microseconds.

Fairness is phase by phase: once a writer waits, new readers queue behind
it, so writers are never starved; and the readers that were waiting when a
writer finishes are let in before the next writer, so readers are not
starved by a stream of writers either.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from lockwarden.errors import NotHeld

__all__ = ["RWLatch"]


class RWLatch:
    """Many readers or one writer; counts only."""

    __slots__ = (
        "_admit",
        "_cond",
        "_phase",
        "_readers",
        "_readers_waiting",
        "_writer",
        "_writers_waiting",
    )

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._readers_waiting = 0
        self._phase = 0
        """Bumped by every write release; a reader that waited through one is admitted."""
        self._admit = 0
        """Admitted readers that have not entered yet; writers wait for them."""

    def acquire_read(self, timeout: float | None = None) -> bool:
        """Enter as a reader; False if `timeout` seconds passed first (None: no limit)."""
        with self._cond:
            if not self._writer and not self._writers_waiting:
                self._readers += 1
                return True
            phase = self._phase
            self._readers_waiting += 1
            try:
                ok = self._cond.wait_for(
                    lambda: (
                        not self._writer and (not self._writers_waiting or self._phase != phase)
                    ),
                    timeout,
                )
            finally:
                self._readers_waiting -= 1
            if self._phase != phase:
                self._admit -= 1  # admitted, whether it enters now or gave up
                if not self._admit:
                    self._cond.notify_all()
            if ok:
                self._readers += 1
            return ok

    def release_read(self) -> None:
        with self._cond:
            if not self._readers:
                raise NotHeld("release_read() without a reader inside the latch")
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    def acquire_write(self, timeout: float | None = None) -> bool:
        """Enter as the writer; False if `timeout` seconds passed first."""
        with self._cond:
            self._writers_waiting += 1
            try:
                ok = self._cond.wait_for(
                    lambda: not self._writer and not self._readers and not self._admit, timeout
                )
            finally:
                self._writers_waiting -= 1
            if ok:
                self._writer = True
            elif not self._writers_waiting:
                self._cond.notify_all()  # readers held back only by this writer may go
            return ok

    def release_write(self) -> None:
        with self._cond:
            if not self._writer:
                raise NotHeld("release_write() without the writer inside the latch")
            self._writer = False
            if self._readers_waiting:
                self._phase += 1
                self._admit += self._readers_waiting
            self._cond.notify_all()

    @contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextmanager
    def write(self) -> Iterator[None]:
        self.acquire_write()
        try:
            yield
        finally:
            self.release_write()

    @property
    def readers(self) -> int:
        return self._readers

    @property
    def writing(self) -> bool:
        return self._writer
