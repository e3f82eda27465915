"""Benchmarks of the in-process lock manager, each beside the physical floor it is judged by.

    python bench/local_manager.py [--quick] [--write-results [PATH]]

Prints a Markdown table; ``--write-results`` also writes the figures as JSON
(by default to bench/results/local_manager.json, the record in the
repository: only for a run on a quiet machine). Every ratio compares two
things measured in the same run, on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lockwarden import Deadlock, LockManager, Mode
from lockwarden.local import Txn

RESULTS = Path(__file__).parent / "results" / "local_manager.json"


def best_per_op(fn: Callable[[int], None], n: int, repeat: int = 7) -> float:
    """Seconds per operation: the best of `repeat` timed batches of `n` (noise only adds time)."""
    fn(n // 10)  # warm up
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn(n)
        times.append(time.perf_counter() - start)
    return min(times) / n


# -- uncontended lock + unlock ---------------------------------------------------------


def uncontended(n: int) -> dict[str, float]:
    mgr = LockManager()
    txn = mgr.begin()
    txn.lock(("orders",), Mode.IX)
    row, x = ("orders", 42), Mode.X
    lock, unlock = txn.lock, txn.unlock

    def manager(k: int) -> None:
        for _ in range(k):
            lock(row, x)
            unlock(row)

    floor = threading.Lock()
    acquire, release = floor.acquire, floor.release

    def thread_lock(k: int) -> None:
        for _ in range(k):
            acquire()
            release()

    ours, base = best_per_op(manager, n), best_per_op(thread_lock, n)
    return {"lockwarden_ns": ours * 1e9, "threading_lock_ns": base * 1e9, "ratio": ours / base}


# -- range scan with next-key locks ----------------------------------------------------


def range_scan(n: int) -> dict[str, float]:
    """lock_range over 100 keys of a 1,000-key index, then release_all; vs 100 row locks.

    A scan takes IS on the table, 100 next-key locks and the gap lock above
    them, each through the general lock call (a step generator reading the
    index after every grant); the floor is the same number of row locks
    through the uncontended fast path, released the same way.
    """
    mgr = LockManager(escalation_threshold=None)
    index = mgr.index("pk", table=("t",), keys=range(1000))
    txn = mgr.begin()
    lock_range, release_all, lock = txn.lock_range, txn.release_all, txn.lock
    s = Mode.S

    def scans(k: int) -> None:
        for i in range(k):
            lo = i * 100 % 900
            lock_range(index, lo, lo + 99, s)
            release_all()

    rows = [("t", i) for i in range(101)]

    def row_locks(k: int) -> None:
        for _ in range(k):
            lock(("t",), Mode.IS)
            for row in rows:
                lock(row, s)
            release_all()

    ours, base = best_per_op(scans, n), best_per_op(row_locks, n)
    return {
        "scans_per_s": 1 / ours,
        "scan_us": ours * 1e6,
        "row_locks_101_us": base * 1e6,
        "ratio": ours / base,
    }


# -- hand-off latency -----------------------------------------------------------------


def handoff(rounds: int) -> dict[str, float]:
    """Release in one thread → the waiting thread holds the lock; vs a Condition ping-pong."""
    # The scheduler's placement of the two threads (same core, other core,
    # idle states) moves both figures by 2x from run to run; alternating
    # short batches lets both see the same conditions.
    ours: list[float] = []
    base: list[float] = []
    batch = 200
    for _ in range(max(1, rounds // batch)):
        ours += _handoff_manager(batch)
        base += _handoff_condition(batch)
    mine, floor = statistics.median(ours), statistics.median(base)
    return {"lockwarden_us": mine * 1e6, "condition_us": floor * 1e6, "ratio": mine / floor}


def _handoff_manager(rounds: int) -> list[float]:
    """Two threads pass one row lock back and forth; each waits queued for the other's release.

    Right after releasing, the releaser blocks (on `got`) until the waiter
    reports in, so the timing covers the hand-off only, not whatever the
    releaser would do next. The Condition version below has the same shape.
    """
    mgr = LockManager(max_wait_timeout=None)
    row = ("t", 1)
    txns = [mgr.begin(), mgr.begin()]
    latencies: list[float] = []
    released_at = [0.0]
    got = [threading.Semaphore(0), threading.Semaphore(0)]

    def player(me: int) -> None:
        txn, other = txns[me], txns[1 - me]
        for i in range(rounds):
            if i or me:
                txn.lock(row, Mode.X, timeout=60)
                latencies.append(time.perf_counter() - released_at[0])
                got[1 - me].release()
            if i == rounds - 1 and me == 1:
                txn.unlock(row)
                return
            while other._waiting is None:
                time.sleep(0)
            released_at[0] = time.perf_counter()
            txn.unlock(row)
            got[me].acquire()

    txns[0].lock(row, Mode.X)
    _play_both(player)
    return latencies


def _handoff_condition(rounds: int) -> list[float]:
    cond = threading.Condition()
    turn = [0]
    waiting = [False, False]
    latencies: list[float] = []
    notified_at = [0.0]
    got = [threading.Semaphore(0), threading.Semaphore(0)]

    def player(me: int) -> None:
        for i in range(rounds):
            if i or me:
                with cond:
                    waiting[me] = True
                    while turn[0] != me:
                        cond.wait()
                    waiting[me] = False
                latencies.append(time.perf_counter() - notified_at[0])
                got[1 - me].release()
            if i == rounds - 1 and me == 1:
                return
            while not waiting[1 - me]:
                time.sleep(0)
            with cond:
                notified_at[0] = time.perf_counter()
                turn[0] = 1 - me
                cond.notify()
            got[me].acquire()

    _play_both(player)
    return latencies


def _play_both(player: Callable[[int], None]) -> None:
    """Run players 0 and 1 in two threads, to the end."""
    threads = [threading.Thread(target=player, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- deadlock detection among 10,000 waiting transactions ---------------------------------


def deadlock_detection(waiters: int) -> dict[str, float]:
    """Time of the request that closes a cycle, with `waiters` transactions already waiting.

    Two shapes, each with the default bounds (depth 200, 1,000,000 steps) and
    with the bounds lifted, so that the search walks the whole graph:

    - chain: T1 waits for T2 … for T_n, T_n for T0; T0's request closes the
      ring. With the default bounds the search stops at depth 200, which
      counts as a deadlock; lifted, the whole 10,001-long cycle is walked.
    - fan: the requester waits for 10,000 readers, each waiting on a
      different running transaction, and only the last one waits for the
      requester: the search visits every one of them either way.
    """
    lifted = {"deadlock_max_depth": waiters + 10, "deadlock_max_steps": 10 * waiters}
    return {
        "chain_default_ms": asyncio.run(_chain(waiters, {})) * 1e3,
        "chain_full_ms": asyncio.run(_chain(waiters, lifted)) * 1e3,
        "fan_default_ms": asyncio.run(_fan(waiters, {})) * 1e3,
        "fan_full_ms": asyncio.run(_fan(waiters, lifted)) * 1e3,
    }


async def _queue_all(calls: list[tuple[Txn, asyncio.Task[Mode]]]) -> None:
    # `_waiting` is private: read here only to start timing once all wait.
    while any(txn._waiting is None for txn, _ in calls):
        await asyncio.sleep(0)


async def _close(txn: Txn, resource: tuple[object, ...]) -> float:
    start = time.perf_counter()
    try:
        await txn.lock_async(resource, Mode.X, timeout=None)
    except Deadlock:
        return time.perf_counter() - start
    raise AssertionError("no deadlock detected")


async def _settle(calls: list[tuple[Txn, asyncio.Task[Mode]]]) -> None:
    for _, task in calls:
        task.cancel()
    await asyncio.gather(*(t for _, t in calls), return_exceptions=True)


def _manager(bounds: dict[str, int]) -> LockManager:
    return LockManager(max_wait_timeout=None, escalation_threshold=None, **bounds)


async def _chain(n: int, bounds: dict[str, int]) -> float:
    """T_i holds row i and waits for row i+1; T_n waits for row 0; T_0 closes the ring."""
    mgr = _manager(bounds)
    txns = [mgr.begin() for _ in range(n + 1)]
    for i, txn in enumerate(txns):
        txn.lock(("r", i), Mode.X)
    calls = [
        (txns[i], asyncio.create_task(txns[i].lock_async(("r", (i + 1) % (n + 1)), Mode.X, None)))
        for i in range(1, n + 1)
    ]
    await _queue_all(calls)
    elapsed = await _close(txns[0], ("r", 1))
    await _settle(calls)
    return elapsed


async def _fan(n: int, bounds: dict[str, int]) -> float:
    mgr = _manager(bounds)
    requester = mgr.begin()
    requester.lock(("z", 0), Mode.X)
    readers = [mgr.begin() for _ in range(n)]
    runners = [mgr.begin() for _ in range(n)]
    for i, (reader, runner) in enumerate(zip(readers, runners, strict=True)):
        reader.lock(("a", 0), Mode.S)
        runner.lock(("b", i), Mode.X)
    calls = []
    for i, reader in enumerate(readers):
        target = ("z", 0) if i == n - 1 else ("b", i)
        calls.append((reader, asyncio.create_task(reader.lock_async(target, Mode.X, None))))
    await _queue_all(calls)
    elapsed = await _close(requester, ("a", 0))
    await _settle(calls)
    return elapsed


# -- memory per held row lock ------------------------------------------------------------


def memory(rows: int) -> dict[str, float]:
    mgr = LockManager(escalation_threshold=None)
    txn = mgr.begin()
    txn.lock(("orders",), Mode.IX)
    keys = [("orders", i) for i in range(rows)]  # the caller's keys: not counted
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for key in keys:
        txn.lock(key, Mode.X)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    return {"bytes_per_row_lock": grown / rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument(
        "--write-results",
        nargs="?",
        const=RESULTS,
        type=Path,
        metavar="PATH",
        help="also write the figures as JSON (default: bench/results/local_manager.json)",
    )
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    load_before = os.getloadavg()[0]
    results: dict[str, Any] = {
        "uncontended_lock_unlock": uncontended(500_000 // scale),
        "range_scan_100": range_scan(5_000 // scale),
        "handoff": handoff(4000 // scale),
        "deadlock_detection_10k": deadlock_detection(10_000),
        "memory": memory(100_000 // scale),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": [load_before, os.getloadavg()[0]],
    }
    if args.write_results is not None:
        args.write_results.parent.mkdir(parents=True, exist_ok=True)
        args.write_results.write_text(json.dumps(results, indent=2) + "\n")
    u, r, h, d, m = (
        results["uncontended_lock_unlock"],
        results["range_scan_100"],
        results["handoff"],
        results["deadlock_detection_10k"],
        results["memory"],
    )
    rows = [
        (
            "uncontended row lock + unlock",
            f"{u['lockwarden_ns']:.0f} ns",
            f"threading.Lock pair {u['threading_lock_ns']:.0f} ns",
            f"{u['ratio']:.1f}x",
            "<= 8x",
        ),
        (
            "next-key range scan of 100 keys + release",
            f"{r['scan_us']:.0f} us ({r['scans_per_s']:,.0f}/s)",
            f"101 row locks + release {r['row_locks_101_us']:.0f} us",
            f"{r['ratio']:.1f}x",
            "(report)",
        ),
        (
            "hand-off, release -> waiter holds (median)",
            f"{h['lockwarden_us']:.1f} us",
            f"Condition ping-pong {h['condition_us']:.1f} us",
            f"{h['ratio']:.2f}x",
            "<= 1.5x",
        ),
        (
            "deadlock, 10,000 waiting: chain, default bounds (stops at depth 200)",
            *ms(d["chain_default_ms"]),
        ),
        ("deadlock, 10,000 waiting: chain, bounds lifted (10,001 walked)", *ms(d["chain_full_ms"])),
        (
            "deadlock, 10,000 waiting: fan, default bounds (10,000 visited)",
            *ms(d["fan_default_ms"]),
        ),
        ("deadlock, 10,000 waiting: fan, bounds lifted", *ms(d["fan_full_ms"])),
        ("memory per held row lock", f"{m['bytes_per_row_lock']:.0f} B", "", "", "(report)"),
    ]
    load = results["load_average"]
    print(f"load average {load[0]:.1f} before, {load[1]:.1f} after ({os.cpu_count()} CPUs)")
    print("| measure | lockwarden | floor | ratio | target |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def ms(value: float) -> tuple[str, str, str, str]:
    return (f"{value:.2f} ms", "", "", "<= 5 ms")


if __name__ == "__main__":
    main()
