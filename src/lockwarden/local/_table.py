"""The lock table and its one mutex: where every queue lives, and the moves every call shares.

Every change to the lock table happens under one `threading.Lock` (README.md,
"One mutex"). With the GIL there is no parallelism to gain from partitioning
it, and the deadlock search needs a consistent view of every queue at once.
Critical sections are short and never block: a thread that must wait leaves
the mutex first and blocks on a gate of its own (``_call.py``).

A resource is in a table only while something is granted or waiting there:
memory grows with the locks held, not with the size of the data.

`LockTable` is the base of `LockManager` (``manager.py``), which adds the
public surface; the modules below the transaction use this class only.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Hashable
from typing import Any

from lockwarden.errors import Deadlock
from lockwarden.local._deadlock import choose_victim, deadlock_error, find_cycle
from lockwarden.local._kinds import DATA, METADATA, RANGE, Table
from lockwarden.local._metadata import MetadataQueue
from lockwarden.local._queue import Owner, Queue, Request
from lockwarden.local._range_queue import KeySpace, RangeQueue
from lockwarden.local._settings import Settings
from lockwarden.modes import Mode


class LockTable:
    """Three lock tables (data, metadata, range) under one mutex, and the manager's counters."""

    # Slots, not an instance dict: CPython keeps the attributes of a plain
    # instance in a shared-key dict only up to about 30 of them, and past
    # that every attribute read on the uncontended path gets slower.
    __slots__ = (
        "_critical",
        "_deadlocks",
        "_depth",
        "_escalation_floor",
        "_escalations",
        "_grants",
        "_meta_queues",
        "_mutex",
        "_next_id",
        "_queues",
        "_range_queues",
        "_settings",
        "_tables",
        "_timeouts",
        "_wait_time",
        "_waits",
        "_wakes",
    )

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._depth = len(settings.levels)
        threshold = settings.escalation_threshold
        self._escalation_floor: float = float("inf") if threshold is None else threshold
        """Escalation is considered only above this many children (README.md, "Escalation")."""
        self._mutex = threading.Lock()
        self._critical = _Critical(self)
        self._queues: dict[Hashable, Queue[Mode] | Request[Mode]] = {}
        """The data lock table: a resource's `Queue`, or, while one owner holds it and nobody
        else has asked, that owner's `Request` alone (a solo lock; README.md, "Solo locks")."""
        self._meta_queues: dict[Hashable, Queue[Mode]] = {}
        self._range_queues: dict[tuple[KeySpace, Hashable], RangeQueue] = {}
        """The lock table of index keys, by (index, key); always queues, never solo locks."""
        self._tables: dict[Table, dict[Any, Any]] = {
            DATA: self._queues,
            METADATA: self._meta_queues,
            RANGE: self._range_queues,
        }
        self._wakes: list[Request[Any]] = []
        """Waiters granted or refused under the mutex, to wake once it is released (`_leave`)."""
        self._next_id = itertools.count(1).__next__
        # Counters, plain attributes: the uncontended path bumps one.
        self._grants = self._waits = self._timeouts = self._deadlocks = self._escalations = 0
        self._wait_time = 0.0

    # -- queues --------------------------------------------------------------------

    def _queue_for(self, table: Table, key: Any) -> Queue[Any]:
        """The queue of `key` in `table`, made on first use."""
        if table is DATA:
            return self._queue(key)
        if table is METADATA:
            return self._meta_queue(key)
        return self._range_queue(key)

    def _queue(self, key: Hashable) -> Queue[Mode]:
        """The queue of `key`: made on first use, or from a solo lock on a second request."""
        entry = self._queues.get(key)
        if isinstance(entry, Queue):
            return entry
        queue = self._queues[key] = Queue(key)
        if entry is not None:
            mode, since = entry.mode, entry.since
            assert mode is not None
            entry.mode = None
            entry.queue = queue
            queue.add_granted(entry, mode)
            if since is not None:
                entry.since = since  # still the time it was granted
        return queue

    def _meta_queue(self, table: Hashable) -> Queue[Mode]:
        queue = self._meta_queues.get(table)
        if queue is None:
            queue = self._meta_queues[table] = MetadataQueue(
                table, self._settings.metadata_exclusive_streak
            )
        return queue

    def _range_queue(self, key: tuple[KeySpace, Hashable]) -> RangeQueue:
        queue = self._range_queues.get(key)
        if queue is None:
            queue = self._range_queues[key] = RangeQueue(key)
        return queue

    # -- an owner's books ------------------------------------------------------------

    def _book(self, req: Request[Any]) -> Request[Mode] | None:
        """Book a granted request with its owner, counted under the owner's parent request.

        Returns the parent request when this one was newly counted under it.
        """
        queue = req.in_queue
        books = req.owner._books(queue.table)
        books[queue.key] = req
        if req.parent is not None:
            return None
        parent_key = queue.parent_key
        parent = req.owner._books(DATA).get(parent_key) if type(parent_key) is tuple else None
        if parent is not None:
            req.parent = parent
            parent.children += 1
        return parent

    def _forget(self, req: Request[Any], *, granted: bool) -> None:
        """Take `req` out of its owner's books (and, if it was granted, its parent's count)."""
        queue = req.in_queue
        del req.owner._books(queue.table)[queue.key]
        if granted and req.parent is not None:
            req.parent.children -= 1
            req.parent = None

    # -- what every call does under the mutex -------------------------------------------

    def _leave(self) -> None:
        """Release the mutex, then wake the waiters whose fate was decided under it.

        Waking after the release spares each woken thread an immediate block
        on the mutex its waker still holds. It is safe because a waiter reads
        its fate (granted, refused) under the mutex, never from the wake-up.
        """
        wakes = self._wakes
        if not wakes:
            self._mutex.release()
            return
        self._wakes = []
        self._mutex.release()
        for req in wakes:
            req.wake()

    def _wake_granted(self, queue: Queue[Any]) -> None:
        """Re-examine a queue after something left it, grant what it can, drop it if idle."""
        if queue.waiting:
            now = time.monotonic()
            for req, since in queue.grant_waiters():
                self._grants += 1
                self._wait_time += now - since
                req.owner._waiting = None
                self._wakes.append(req)
        if not queue.granted and not queue.waiting:
            del self._tables[queue.table][queue.key]

    def _drop(self, req: Request[Any]) -> None:
        """Release one granted request and re-examine its queue."""
        queue = req.in_queue
        queue.remove_granted(req)
        self._forget(req, granted=True)
        self._wake_granted(queue)

    def _set_held(self, req: Request[Any], mode: Any) -> None:
        """Make a granted request hold `mode` instead (None: release it), then re-examine its queue.

        For a call giving back what it took (undo, and the insert intention
        once the insert is done). Not for `req` while it waits.
        """
        if mode is None:
            self._drop(req)
            return
        queue = req.in_queue
        queue.add_granted(req, mode)
        self._wake_granted(queue)

    def _refuse(self, req: Request[Any]) -> None:
        """Take a waiting request out of its queue (timeout, cancellation, deadlock victim)."""
        queue = req.in_queue
        queue.remove_waiting(req)
        assert req.since is not None  # stamped when it started to wait
        self._wait_time += time.monotonic() - req.since
        if req.mode is None:
            self._forget(req, granted=False)
        req.owner._waiting = None
        self._wake_granted(queue)

    def _resolve_deadlocks(self, owner: Owner) -> Deadlock | None:
        """Search for cycles through `owner`'s wait; refuse victims until none is left.

        Returns the error when `owner` itself was the victim (its request has
        been refused; the caller fails its call). Other victims get theirs
        through `failure` and a wake-up.
        """
        req = owner._waiting
        assert req is not None
        settings = self._settings
        while req.wanted is not None:
            found = find_cycle(owner, settings.deadlock_max_steps, settings.deadlock_max_depth)
            if found is None:
                return None
            path, complete = found
            victim = choose_victim(settings.victim, path) if complete else owner
            self._deadlocks += 1
            error = deadlock_error(victim, path, complete)
            victim_req = victim._waiting
            assert victim_req is not None
            self._refuse(victim_req)
            if victim is owner:
                return error
            victim_req.failure = error
            self._wakes.append(victim_req)
        return None


class _Critical:
    """``with table._critical:`` holds the mutex and delivers wake-ups after releasing it."""

    __slots__ = ("_table",)

    def __init__(self, table: LockTable) -> None:
        self._table = table

    def __enter__(self) -> None:
        self._table._mutex.acquire()

    def __exit__(self, *exc: object) -> None:
        self._table._leave()
