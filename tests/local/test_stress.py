"""Eight threads on a few hot rows: mutual exclusion, progress, and an empty table at the end."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import defaultdict

import pytest

from lockwarden import Deadlock, LockManager, LockTimeout, Mode

THREADS = 8
TXNS_PER_THREAD = 150
ROWS = 6


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["requester", "youngest", "fewest_locks"])
def test_many_threads_keep_mutual_exclusion(victim: str) -> None:
    mgr = LockManager(victim=victim, wait_timeout=0.2, max_wait_timeout=None)  # type: ignore[arg-type]
    guard = threading.Lock()  # protects the occupancy counters below, never held while locking
    readers: dict[int, int] = defaultdict(int)
    writers: dict[int, int] = defaultdict(int)
    balances = [0] * ROWS  # unguarded read-modify-write, protected only by the X row locks
    committed = [0] * THREADS
    retries = [0] * THREADS
    violations: list[str] = []

    def enter(row: int, mode: Mode) -> None:
        with guard:
            if writers[row] or (mode is Mode.X and readers[row]):
                violations.append(f"row {row}: {mode} beside {readers[row]}r/{writers[row]}w")
            if mode is Mode.X:
                writers[row] += 1
            else:
                readers[row] += 1

    def leave(row: int, mode: Mode) -> None:
        with guard:
            if mode is Mode.X:
                writers[row] -= 1
            else:
                readers[row] -= 1

    def worker(n: int) -> None:
        rnd = random.Random(n)
        done = 0
        while done < TXNS_PER_THREAD:
            size = rnd.randint(1, 3)
            plan = [(rnd.randrange(ROWS), rnd.choice([Mode.S, Mode.X])) for _ in range(size)]
            held: list[tuple[int, Mode]] = []
            txn = mgr.begin()
            try:
                for row, mode in plan:
                    got = txn.lock(("acct", row), mode)
                    if all(r != row for r, _ in held):
                        held.append((row, got))
                        enter(row, got)
                    elif got is Mode.X and (row, Mode.S) in held:  # upgraded in place
                        leave(row, Mode.S)
                        held[held.index((row, Mode.S))] = (row, Mode.X)
                        enter(row, Mode.X)
                for row, mode in held:
                    if mode is Mode.X:
                        value = balances[row]
                        time.sleep(0.0001)  # let another thread run mid-update
                        balances[row] = value + 1
                done += 1
                committed[n] += sum(1 for _, m in held if m is Mode.X)
            except (Deadlock, LockTimeout):
                retries[n] += 1
            finally:
                for row, mode in held:
                    leave(row, mode)
                txn.release_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave threads inside the lock calls, not only between them
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "a worker is stuck"
    finally:
        sys.setswitchinterval(interval)

    assert violations == []
    assert sum(balances) == sum(committed)  # no lost update
    assert mgr.locks() == []
    assert mgr._queues == {}
    stats = mgr.stats()
    assert stats.grants > THREADS * TXNS_PER_THREAD
    assert stats.waits > 100  # there was real contention
    assert stats.deadlocks > 0  # and cycles to break (upgrades and crossing rows)
