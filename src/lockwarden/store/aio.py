"""The asyncio form of the store's waits.

The waiting loop is `waiting.acquire_steps`, the same generator the threaded
form runs; here its database calls run in worker threads and its waits
suspend the task. A cancelled task leaves nothing behind: a database call in
flight is allowed to finish (it cannot be taken back), then the loop's own
clean-up removes whatever the request had stored.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine, Generator
from contextlib import suppress
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from lockwarden.store import inbox
from lockwarden.store.waiting import Call, Driver, Listen, Steps
from lockwarden.store.wakeups import Subscription, Wakeups, Woken

T = TypeVar("T")


class AsyncSubscription(Subscription):
    """A subscription waited on from an event loop; wake-ups arrive from other threads,
    and a release's poke, where the request has a mailbox (`inbox`), on the loop itself:
    the loop reads the mailbox, so a grant wakes the task with no thread in between."""

    def __init__(
        self,
        names: frozenset[str],
        request_id: str,
        loop: asyncio.AbstractEventLoop,
        mailbox: socket.socket | None = None,
    ) -> None:
        super().__init__(names, request_id)
        self._loop = loop
        self._async_event = asyncio.Event()
        self._mailbox = mailbox
        if mailbox is not None:
            loop.add_reader(mailbox, self._read)

    @classmethod
    def open(cls, names: frozenset[str], request_id: str, *, pokes: bool) -> AsyncSubscription:
        """A subscription for the running loop; if releases may poke its waiters
        (``pokes``, `Backend.pokes`), with a mailbox for ``request_id`` where one can be
        had (`inbox.open_mailbox`) and the loop can watch a socket (not every event loop
        can: then a poke goes to the store's inbox, as for a waiter with no mailbox)."""
        loop = asyncio.get_running_loop()
        opened = inbox.open_mailbox(request_id) if pokes else None
        if opened is not None:
            mailbox = opened[0]
            try:
                return cls(names, request_id, loop, mailbox)
            except NotImplementedError:
                mailbox.close()
        return cls(names, request_id, loop)

    def _read(self) -> None:
        """The mailbox has something (called on the loop): take it in, and wake the task if
        a wake-up is pending."""
        assert self._mailbox is not None  # read only until `close`
        inbox.read_mailbox(self._mailbox, self)
        if self._event.is_set():
            self._async_event.set()

    def close(self) -> None:
        """Stop reading the mailbox, and close it (on the loop)."""
        if self._mailbox is not None:
            self._loop.remove_reader(self._mailbox)
            self._mailbox.close()
            self._mailbox = None

    def notify(self) -> None:
        super().notify()
        with suppress(RuntimeError):  # the loop has closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._async_event.set)

    async def wait_async(self, timeout: float | None) -> Woken:
        # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that
        # arrives as the event is set, and the cancelled waiter would go on waiting.
        with suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._async_event.wait()
        self._async_event.clear()
        return self._woken()


async def run_async(steps: Steps[T], wakeups: Wakeups, *, pokes: bool = False) -> T:
    """Drive ``steps`` on the running event loop; if releases may poke its waiters
    (``pokes``, `Backend.pokes`), with a mailbox of its own while it waits."""
    driver = Driver(steps)
    sub: AsyncSubscription | None = None
    try:
        while (step := driver.next_step()) is not None:
            try:
                if isinstance(step, Call):
                    driver.outcome(await _in_thread(step.fn))
                elif isinstance(step, Listen):
                    sub = AsyncSubscription.open(step.names, step.request_id, pokes=pokes)
                    # Starting the listener may wait for its connection: not on the loop.
                    await _in_thread(
                        partial(wakeups.add, sub, step.since, step.epoch, step.timeout)
                    )
                elif step.woken and sub is not None:
                    driver.outcome(await sub.wait_async(step.seconds))
                else:
                    await asyncio.sleep(step.seconds or 0.0)
            except BaseException as exc:  # a cancellation too: the generator cleans up
                driver.outcome(error=exc)
    finally:
        if sub is not None:
            wakeups.remove(sub)
            sub.close()
    return driver.result


async def _in_thread(fn: Callable[[], T]) -> T:
    future = asyncio.get_running_loop().run_in_executor(None, fn)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # Let the call finish so that the clean-up step runs after it, not
        # beside it; a second cancellation does not cut this short.
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                continue
            except Exception:
                break
        raise


class AsyncAcquire(Coroutine[Any, Any, T]):
    """``await`` it for the lock, or use it as ``async with``, which also releases.

    It is a coroutine, so ``asyncio.create_task`` takes it too.
    """

    def __init__(self, acquire: Coroutine[Any, Any, T], release: Callable[[T], None]) -> None:
        self._acquire = acquire
        self._release = release
        self._held: T | None = None

    def send(self, value: Any) -> Any:
        return self._acquire.send(value)

    def throw(self, *args: Any) -> Any:
        return self._acquire.throw(*args)

    def close(self) -> None:
        self._acquire.close()

    def __await__(self) -> Generator[Any, None, T]:
        return self._acquire.__await__()

    async def __aenter__(self) -> T:
        self._held = await self._acquire
        return self._held

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        held, self._held = self._held, None
        if held is not None:
            await asyncio.to_thread(self._release, held)
