"""The asyncio form: awaiting, async with, and cancellation that leaves nothing behind."""

from __future__ import annotations

import asyncio
import random

import pytest

from lockwarden import LockTimeout, LockUsageError
from lockwarden.store import HeldLock, Stamp, Store


def test_await_and_async_with(store: Store) -> None:
    async def main() -> None:
        with store.session(app_id="a") as a, store.session(app_id="b") as b:
            async with a.lock_async("aio", timeout=5) as lk:
                assert isinstance(lk, HeldLock)
                assert [e.token for e in store.locks()] == [lk.token]
                with pytest.raises(LockTimeout):
                    await b.lock_async("aio", timeout=0.1)
            assert store.locks() == []
            stamp = await b.lock_many_async([("x", "read"), ("y", "write")], timeout=1)
            assert isinstance(stamp, Stamp) and len(store.locks()) == 2
            stamp.release()

    asyncio.run(main())


def test_the_lock_an_await_returns_is_an_async_context_manager(store: Store) -> None:
    async def main() -> None:
        with store.session(app_id="a") as a:
            async with await a.lock_async("aio", timeout=5) as held:
                assert isinstance(held, HeldLock)
                assert [e.token for e in store.locks()] == [held.token]
                with pytest.raises(LockUsageError, match="this task already holds"):
                    await a.lock_async("aio", timeout=5)
            assert store.locks() == []
            async with await a.lock_many_async([("x", "read"), ("y", "write")]) as stamp:
                assert isinstance(stamp, Stamp) and len(store.locks()) == 2
            assert store.locks() == []

    asyncio.run(main())


async def _queue_behind_a_holder(
    store: Store, name: str
) -> tuple[HeldLock, asyncio.Task[HeldLock]]:
    """A lock held by one session, and a task of another session queued for it."""
    held = store.session(app_id="holder").lock(name)
    task = asyncio.create_task(store.session(app_id="waiter").lock_async(name, timeout=10))
    while not store.waiters(name):
        await asyncio.sleep(0.01)
    return held, task


def test_a_waiting_task_is_woken_by_a_release(store: Store) -> None:
    async def main() -> None:
        held, task = await _queue_behind_a_holder(store, "wake")
        await asyncio.to_thread(held.release)
        got = await asyncio.wait_for(task, 5)
        assert [e.token for e in store.locks()] == [got.token]
        got.release()

    asyncio.run(main())


def test_cancelling_a_waiter_leaves_no_row(store: Store) -> None:
    async def main() -> None:
        held, task = await _queue_behind_a_holder(store, "c")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert store.waiters() == []
        assert [e.token for e in store.locks()] == [held.token]

    asyncio.run(main())


def test_cancelling_at_any_moment_leaves_no_row(store: Store) -> None:
    """Cancellations landing before, during and after the database calls."""
    rng = random.Random(7)

    async def main() -> None:
        with store.session(app_id="b") as b:
            for _ in range(30):
                task = asyncio.create_task(b.lock_many_async([("r1", "write"), ("r2", "read")]))
                await asyncio.sleep(rng.uniform(0, 0.004))
                task.cancel()
                try:
                    stamp = await task
                except asyncio.CancelledError:
                    pass
                else:
                    stamp.release()
                assert store.locks() == [] and store.waiters() == []

    asyncio.run(main())
