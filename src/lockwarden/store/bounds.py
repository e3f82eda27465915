"""Every call to a database bounded in time.

A holder that waits on its database without a bound cannot keep the promise
that matters most to it: a network partition (a dead route, a firewall, a
frozen proxy: packets go nowhere and nothing answers) would hold its
heartbeat, its `check` and its release for as long as the partition lasts,
while the database hands its locks to someone else. So every call a store
makes ends within its **call timeout** (`CALL_TIMEOUT` unless
``connect(call_timeout=...)`` says otherwise), retries included, or fails
with `StoreError`:

- connecting, by the driver's own connect timeout, never longer than the
  time the call has left (libpq's ``connect_timeout``, honoured when the URL
  gives one; MySQL's; each etcd request's);
- a statement in flight, by a socket shut down under it when its time is
  up (`Cutter`): the driver's blocking read returns at once, whatever the
  driver, and the connection is discarded. Where the store reads replies
  itself (PostgreSQL's prepared calls, etcd's requests) it waits in a poll
  or a timeout of its own instead;
- waiting for a pooled connection or for SQLite's writer file lock, by the
  same deadline.

A caller may narrow the bound for the calls it makes (`within`): the
heartbeat's renewal must end before its session's lease does, since a later
reply proves nothing (design note, "Heartbeat and lost locks"), and a
`check` answers by the lease's end at the latest. The narrowing is carried
by a context variable, so it applies to the calls of one thread (or task)
and to nothing else.
"""

from __future__ import annotations

import heapq
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from lockwarden.errors import StoreError

CALL_TIMEOUT = 5.0
"""Seconds one call to the database may take by default, retries included: well inside
a default lease (15 s), and short enough that a command that cannot reach its database
at all says so within 10 s (docs/operators.md, "Partitions")."""

_END: ContextVar[float] = ContextVar("lockwarden_call_end", default=math.inf)
"""When (``time.monotonic``) the calls of this thread or task must have ended, as the
innermost `within` says (infinity: only their own call timeout)."""


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Calls made inside end within ``seconds`` from now (or sooner, as an enclosing
    `within` or their own call timeout says)."""
    token = _END.set(min(_END.get(), time.monotonic() + max(0.0, seconds)))
    try:
        yield
    finally:
        _END.reset(token)


def deadline(call_timeout: float) -> float:
    """When (``time.monotonic``) a call that starts now must have ended."""
    return min(time.monotonic() + call_timeout, _END.get())


def overran(display: str, began: float, cause: str = "") -> StoreError:
    """The error of a call that ran out of time (``began``: when it started, monotonic)."""
    because = f": {cause}" if cause else ""
    return StoreError(
        f"lock store {display}: no answer within {time.monotonic() - began:.1f} s "
        f"(is the database reachable?){because}"
    )


class Watched:
    """One call whose socket `Cutter` shuts down if the call is still running at its
    deadline. Used as a context manager around the blocking part of the call."""

    __slots__ = ("_cutter", "_fileno", "_lock", "_running", "cut", "deadline")

    def __init__(self, cutter: Cutter, fileno: int, deadline: float) -> None:
        self._cutter = cutter
        self._fileno = fileno
        self._lock = threading.Lock()
        self._running = True
        self.deadline = deadline
        self.cut = False
        """Whether the call's time ran out and its socket was shut down under it."""

    def __enter__(self) -> Watched:
        self._cutter._watch(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # after this the descriptor may be closed and reused: hands off
            self._running = False

    def _cut(self) -> None:
        """Shut the socket down if the call still runs (from the cutter's thread)."""
        with self._lock:
            if not self._running:
                return
            self.cut = True
            try:
                sock = socket.socket(fileno=self._fileno)
            except OSError:  # not a socket any more (the driver closed it meanwhile)
                return
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already shut down, or not connected yet: the driver's error tells
            finally:
                sock.detach()  # the descriptor stays the driver's, to close


class Cutter:
    """One thread per process that shuts down the sockets of calls past their deadline.

    Shutting a socket down from another thread is the one way to end a blocking
    read of any driver at once: the read returns end-of-file or an error, the
    driver reports the connection broken, and the pool discards it. The thread
    only sleeps and shuts sockets down: no call of its own can hold it up.
    A watched call costs a heap push and two uncontended lock operations.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Watched]] = []
        self._count = 0
        self._thread: threading.Thread | None = None
        self._pid = 0

    def watch(self, fileno: int, deadline: float) -> Watched:
        """A `Watched` for the call on socket ``fileno`` that must end by ``deadline``."""
        return Watched(self, fileno, deadline)

    def _watch(self, call: Watched) -> None:
        with self._cond:
            if self._pid != os.getpid():  # first use, or a forked child: no thread yet
                self._pid = os.getpid()
                self._heap.clear()
                self._thread = threading.Thread(
                    target=self._run, name="lockwarden-cutter", daemon=True
                )
                self._thread.start()
            while self._heap and not self._heap[0][2]._running:  # calls that ended in time
                heapq.heappop(self._heap)
            self._count += 1
            earliest = not self._heap or call.deadline < self._heap[0][0]
            heapq.heappush(self._heap, (call.deadline, self._count, call))
            if earliest:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                while self._heap and (self._heap[0][0] <= now or not self._heap[0][2]._running):
                    due = heapq.heappop(self._heap)[2]
                    if due._running:
                        due._cut()
                wait = self._heap[0][0] - now if self._heap else 3600.0
                self._cond.wait(min(wait, 3600.0))


CUTTER = Cutter()
"""The process's one `Cutter`."""
