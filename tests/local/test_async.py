"""The asyncio form: a wait suspends the task; cancellation leaves nothing behind."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lockwarden import Deadlock, LockManager, LockTimeout, Mode

S, X, IX = Mode.S, Mode.X, Mode.IX
ROW = ("orders", 1)


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def queued(txn: object) -> None:
    while txn._waiting is None:  # type: ignore[attr-defined]
        await asyncio.sleep(0)


def test_a_waiting_task_does_not_block_the_loop(mgr: LockManager) -> None:
    async def main() -> list[str]:
        holder, waiter = mgr.begin(), mgr.begin()
        holder.lock(ROW, X)
        events: list[str] = []

        async def wait_for_it() -> None:
            assert await waiter.lock_async(ROW, S, timeout=5) is S
            events.append("granted")

        task = asyncio.create_task(wait_for_it())
        await queued(waiter)
        events.append("loop still runs")
        holder.unlock(ROW)
        await task
        return events

    assert run(main()) == ["loop still runs", "granted"]


def test_cancelling_a_waiting_task_removes_its_request(mgr: LockManager) -> None:
    async def main() -> None:
        holder, waiter, behind = mgr.begin(), mgr.begin(), mgr.begin()
        holder.lock(ROW, S)
        task = asyncio.create_task(waiter.lock_async(ROW, X, timeout=5))
        await queued(waiter)
        follower = asyncio.create_task(behind.lock_async(ROW, S, timeout=5))
        await queued(behind)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await follower is S  # the X in front of it is gone
        assert waiter.held(ROW) is None and waiter.held(("orders",)) is None
        assert waiter._waiting is None
        assert {(i.owner, i.mode) for i in mgr.locks() if i.resource == ROW} == {
            (holder.id, S),
            (behind.id, S),
        }

    run(main())


def test_async_timeout_and_deadlock(mgr: LockManager) -> None:
    async def main() -> None:
        a, b = mgr.begin(), mgr.begin()
        a.lock(("t", 1), X)
        b.lock(("t", 2), X)
        with pytest.raises(LockTimeout):
            await b.lock_async(("t", 1), X, timeout=0.01)
        task = asyncio.create_task(a.lock_async(("t", 2), X, timeout=5))
        await queued(a)
        with pytest.raises(Deadlock):
            await b.lock_async(("t", 1), X, timeout=5)
        b.release_all()
        assert await task is X

    run(main())


def test_a_thread_releasing_wakes_a_task(mgr: LockManager) -> None:
    holder, waiter = mgr.begin(), mgr.begin()
    holder.lock(ROW, X)

    async def main() -> Mode:
        task = asyncio.create_task(waiter.lock_async(ROW, X, timeout=5))
        await queued(waiter)
        threading.Timer(0.01, holder.release_all).start()
        return await task

    assert run(main()) is X


def test_uncontended_async_lock_and_already_held(mgr: LockManager) -> None:
    async def main() -> None:
        txn = mgr.begin()
        assert await txn.lock_async(ROW, X) is X
        assert await txn.lock_async(ROW, S) is X  # covered
        assert txn.held(("orders",)) is IX

    run(main())
