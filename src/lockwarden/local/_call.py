"""One lock call in progress: its steps root to leaf, its waits (threads and tasks), its undo.

A call may take several steps (intention locks, then the target; a range
scan, key after key). It takes them one at a time under the mutex, from an
iterator, so a range call can decide its next key from the index as it is
after a wait. When a step must wait, the call arms a gate, leaves the mutex
and blocks on the gate: a `threading.Lock` held by nobody but released by the
waker (threads), or an `asyncio.Future` settled through
``call_soon_threadsafe`` (tasks). Woken, or out of time, it takes the mutex
and reads its fate from the table, never from the wake-up (README.md,
"Waiting and waking").

A call is all or nothing: for each request it touches it keeps what that
request held before (``undo``), and a call that fails (timeout, deadlock,
cancellation) restores each, newest first. So after a failed call the owner
holds exactly what it held before (README.md, "A call is all or nothing").
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Generator, Hashable, Iterator
from typing import Any

from lockwarden.errors import LockTimeout, LockUsageError
from lockwarden.local._escalation import maybe_escalate
from lockwarden.local._kinds import Step
from lockwarden.local._queue import Owner, Queue, Request
from lockwarden.local._table import LockTable
from lockwarden.modes import Mode


class Call:
    """A lock call: made under the manager's mutex, it takes every step that need not wait.

    `first` is then the request it waits for (None: done, `result` is the
    mode held). `wait` or `wait_async` drive it through its waits.
    """

    __slots__ = (
        "deadline",
        "first",
        "grown",
        "limit",
        "loop",
        "owner",
        "result",
        "steps",
        "table",
        "undo",
    )

    def __init__(
        self,
        table: LockTable,
        owner: Owner,
        steps: Iterator[Step],
        limit: float,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.table = table
        self.owner = owner
        self.steps = steps
        self.limit = limit
        self.deadline = time.monotonic() + limit
        self.loop = loop
        self.undo: dict[Request[Any], Any] = {}
        """Each request the call changed → what it held before the call (None: nothing).

        Undo restores each to that, which is the same whatever order the steps
        came in. Index changes during the call rewrite the entries of the
        requests they move (``_ranges.py``), so the undo stays exact."""
        self.result: Any = None
        self.grown: dict[int, tuple[Request[Mode], Any]] = {}
        """Parents that counted a new child in this call (by id), for escalation once it
        succeeds: a call that escalates never has to undo an escalation."""
        owner._undo = self.undo
        self.first = self._advance()

    def _advance(self) -> Request[Any] | None:
        """Take steps until one must wait; return that request (queued), or None when done."""
        owner = self.owner
        table = self.table
        try:
            for kind, key, step_mode in self.steps:
                books = owner._books(kind)
                req = books.get(key)
                before = None
                mode = step_mode
                if req is not None:
                    before = req.mode
                    assert before is not None
                    if before.covers(mode):
                        self.result = before
                        continue
                    mode = before.join(mode)
                    queue = req.queue or table._queue_for(kind, key)
                else:
                    queue = table._queue_for(kind, key)
                    req = Request(owner, queue, None, None)
                self.undo.setdefault(req, before)
                if not queue.blocked_on_arrival(req, mode):
                    queue.add_granted(req, mode)
                    queue.granted_one(req)
                    table._grants += 1
                    self._book(req)
                    continue
                if self.deadline <= time.monotonic():
                    raise self._failed(self._timeout(req, mode))
                if before is None:
                    books[key] = req
                queue.enqueue(req, mode)
                self._arm(req)
                owner._waiting = req
                table._waits += 1
                error = table._resolve_deadlocks(owner)
                if error is not None:
                    raise self._failed(error)
                return req
        except LockUsageError as error:  # a range call found the index changed under it
            raise self._failed(error) from None
        owner._undo = None
        for parent, parent_key in self.grown.values():
            if parent.children > table._escalation_floor:
                maybe_escalate(table, owner, parent, parent_key)
        return None

    def _book(self, req: Request[Any]) -> None:
        """A step was granted: book it with the owner, under its parent."""
        self.result = req.mode
        parent = self.table._book(req)
        if parent is not None:
            self.grown[id(parent)] = (parent, req.in_queue.parent_key)

    def _granted(self, req: Request[Any]) -> None:
        """Another thread granted the wait on `req`: book it, unless an index change since did.

        A grant makes the request its owner's at once, under the mutex, while
        the waiting thread is away; an index change before that thread comes
        back moves it like any granted lock (``_ranges.py``, `_move`). Moved, it
        is booked where it went; merged into the owner's request on the next
        key, or dropped (a lone insert intention), it holds nothing, and booking
        it would put a request that holds nothing in the owner's books over the
        one that survived. The call reports the mode it was granted.
        """
        if req.mode is not None:
            self._book(req)
        self.result = req.grant

    def _arm(self, req: Request[Any]) -> None:
        """Give the waiting request something to block on, and the way to release it."""
        if self.loop is None:
            gate = threading.Lock()
            gate.acquire()
            req.arm(gate, gate.release)
        else:
            future = self.loop.create_future()
            loop = self.loop
            req.arm(future, lambda: loop.call_soon_threadsafe(_settle, future))

    # -- waiting ---------------------------------------------------------------------

    def wait(self) -> Any:
        """Block the thread through the call's waits (each on its own gate) until it ends."""
        req = self.first
        while req is not None:
            remaining = min(self.deadline - time.monotonic(), threading.TIMEOUT_MAX)
            gate: threading.Lock = req.signal
            woke = gate.acquire(True, remaining) if remaining > 0 else gate.acquire(False)
            req = self._resume(req, woke)
        return self.result

    async def wait_async(self) -> Any:
        """`wait` for asyncio: a wait suspends the task; cancelling it withdraws the request."""
        req = self.first
        while req is not None:
            future: asyncio.Future[None] = req.signal
            woke = True
            left = self.deadline - time.monotonic()
            try:
                async with asyncio.timeout(None if left == math.inf else max(0.0, left)):
                    await future
            except TimeoutError:
                woke = False
            except asyncio.CancelledError:
                self._cancel(req)
                raise
            req = self._resume(req, woke)
        return self.result

    def _resume(self, req: Request[Any], woke: bool) -> Request[Any] | None:
        """After a wait on `req`: carry on with the next step, or fail cleanly."""
        table = self.table
        table._mutex.acquire()  # not `with table._critical`: this is every waiter's hand-off path
        try:
            if req.failure is not None:
                raise self._failed(req.failure)
            if req.wanted is None:  # granted (even if the wake raced a timeout)
                self._granted(req)
                return self._advance()
            assert not woke, "woken, but neither granted nor refused"
            table._timeouts += 1
            error = self._timeout(req, req.wanted)
            table._refuse(req)
            raise self._failed(error)
        finally:
            table._leave()

    def _cancel(self, req: Request[Any]) -> None:
        """The waiting task was cancelled: withdraw the request and undo the call."""
        with self.table._critical:
            if req.failure is None:
                if req.wanted is not None:
                    self.table._refuse(req)
                else:  # granted just before the cancellation landed
                    self._granted(req)
            self.owner._waiting = None
            self._rollback()

    # -- failing -----------------------------------------------------------------------

    def _failed(self, error: BaseException) -> BaseException:
        self.owner._waiting = None
        self._rollback()
        return error

    def _rollback(self) -> None:
        """Give back what this call acquired, newest first, and end its steps."""
        self.owner._undo = None
        if isinstance(self.steps, Generator):
            self.steps.close()  # an insert in progress deregisters from its index
        for req, before in reversed(self.undo.items()):
            if req.mode is not None:
                self.table._set_held(req, before)
            else:  # refused while new, or an insert intention given back: nothing held before
                assert before is None
        self.undo.clear()

    def _timeout(self, req: Request[Any], mode: Any) -> LockTimeout:
        queue = req.in_queue
        blockers = tuple(_blocker_ids(queue, req, mode))
        tried = "a try" if self.limit == 0 else f"{self.limit:g} s"
        resource: Hashable = queue.resource
        return LockTimeout(
            f"txn {self.owner.id} could not get {queue.table.noun} {mode.value} on "
            f"{resource!r} ({tried}); blocked by txn {', '.join(map(str, blockers))}",
            name=resource,
            mode=mode,
            timeout=self.limit,
            blockers=blockers,
        )


def _blocker_ids(queue: Queue[Any], req: Request[Any], mode: Any) -> list[int]:
    """Who `req` waits for, or, not queued (a failed try), everyone it would have waited for."""
    if req.wanted is not None:
        return [r.owner.id for r in queue.blockers(req)]
    return [r.owner.id for r in queue.would_block(req, mode)]


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
