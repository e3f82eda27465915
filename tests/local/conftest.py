"""Helpers for driving the lock manager from several threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from lockwarden.local import LockManager, Txn


class Attempt:
    """A blocking call (usually ``txn.lock``) running in its own thread.

    `queued()` waits until the txn is actually waiting in a queue, so a test
    can set up an exact queue order without sleeping and hoping.
    """

    def __init__(self, txn: Txn, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.txn = txn
        self.result: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()

        def run() -> None:
            try:
                self.result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the test thread
                self.error = exc
            finally:
                self._done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def queued(self, timeout: float = 5.0) -> Attempt:
        deadline = time.monotonic() + timeout
        while self.txn._waiting is None:
            if self._done.is_set():
                raise AssertionError(f"call ended instead of queueing: {self.error or self.result}")
            if time.monotonic() > deadline:
                raise AssertionError("call never queued")
            time.sleep(0.0005)
        return self

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def settle(self, timeout: float = 0.05) -> bool:
        """Wait a little; whether the call has ended (for asserting it is still blocked)."""
        return self._done.wait(timeout)

    def join(self, timeout: float = 5.0) -> Any:
        assert self._done.wait(timeout), "call did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def spin(loop: asyncio.AbstractEventLoop, seconds: float = 0.0) -> None:
    """Run `loop` until every task that can move has moved (after `seconds`, if given)."""

    async def run() -> None:
        if seconds:
            await asyncio.sleep(seconds)
        for _ in range(30):
            await asyncio.sleep(0)

    loop.run_until_complete(run())


def assert_kept_edges_are_fresh(mgr: LockManager) -> None:
    """Every waiter's edges kept by the deadlock search are those its queue gives it now.

    The search keeps them on the owner and every change to the queue clears
    them (``_deadlock.py``): a change that forgot to would leave them stale
    here, and a flag not set where edges are kept would let one slip by.
    """
    for _, entry in mgr._all_entries():
        for req in getattr(entry, "waiting", ()):
            kept = req.owner._waits_for
            if kept is not None:
                assert entry.edges_kept, f"txn {req.owner.id} keeps edges its queue never clears"
                fresh = tuple(reversed([b.owner for b in entry.blockers(req)]))
                assert kept == fresh, (req.owner.id, entry.resource, kept, fresh)


@pytest.fixture
def mgr() -> LockManager:
    """A manager whose waits may be long enough for threads to be scheduled reliably."""
    return LockManager(max_wait_timeout=None, max_ddl_wait_timeout=None)
