"""The example key-value store under concurrent transactions: its histories are serializable.

Several threads run random read-range, insert, delete, update and
scan-then-write transactions; a transaction that meets a Deadlock or a
LockTimeout aborts and runs again. The store logs every operation in the
order it took effect. The checker then

- builds the precedence graph of the committed transactions (an edge for
  each pair of conflicting operations, in history order: two operations on
  one key where one writes, or a scan and a write of a key in its range)
  and requires it to have no cycle: the history is conflict-serializable;
- replays the committed transactions one at a time in an order the graph
  allows and requires every read and scan to see what it saw, and the final
  data to be the store's: no dirty read, no lost update, no phantom.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import threading
import time
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any

import pytest

from lockwarden import Deadlock, LockTimeout

_PATH = Path(__file__).resolve().parents[2] / "examples" / "kvstore.py"
_spec = importlib.util.spec_from_file_location("kvstore", _PATH)
assert _spec is not None and _spec.loader is not None
kvstore = importlib.util.module_from_spec(_spec)
sys.modules["kvstore"] = kvstore
_spec.loader.exec_module(kvstore)

INITIAL = {k: f"init:{k}" for k in range(0, 21, 4)}
THREADS, PER_THREAD = 8, 100


def workload(rng: random.Random, counter: list[int]) -> Any:
    """One random transaction, as a function of its Transaction (it may run several times).

    Pauses between the steps let the threads interleave while locks are
    held, which is when phantoms and lost updates would show.
    """
    kind = rng.choice(["read-range", "insert", "delete", "update", "scan-then-write"])
    lo = rng.randrange(0, 20)
    hi = lo + rng.randrange(0, 6)
    key = rng.randrange(0, 22)

    def work(tx: Any) -> None:
        counter[0] += 1
        value = f"{tx.id}:{kind}"
        if kind == "read-range":  # the same range twice: a phantom would show in between
            tx.scan(lo, hi)
            pause()
            tx.scan(lo, hi)
        elif kind == "insert":
            tx.put(key, value)
        elif kind == "delete":
            tx.delete(key)
        elif kind == "update":
            if tx.get(key) is not None:
                pause()
                tx.put(key, value)
        else:  # a write decided by a range read, into what others may be reading
            items = tx.scan(lo, hi)
            pause()
            tx.put(key, f"{value}:{len(items)}")
        pause()  # before the commit: let the others in while the locks are held

    def pause() -> None:
        time.sleep(rng.random() / 500)

    return work


def run_threads(store: Any) -> list[int]:
    attempts: list[int] = []
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(PER_THREAD):
            counter = [0]
            try:
                store.run(workload(rng, counter))
            except BaseException as exc:  # handed to the test thread
                errors.append(exc)
                return
            attempts.append(counter[0])

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return attempts


def check_serializable(
    history: list[tuple[Any, ...]], final: dict[Any, Any], initial: dict[Any, Any] = INITIAL
) -> list[int]:
    """The checker: returns a serial order of the committed transactions, or fails."""
    outcome = {entry[0]: entry[1] for entry in history if entry[1] in ("commit", "abort")}
    committed = {tid for tid, end in outcome.items() if end == "commit"}
    ops = [(seq, entry) for seq, entry in enumerate(history) if entry[0] in committed]
    ops = [(seq, e) for seq, e in ops if e[1] in ("read", "scan", "write")]

    writes: dict[Any, list[tuple[int, int]]] = defaultdict(list)
    for seq, (tid, kind, key, *_) in ops:
        if kind == "write":
            writes[key].append((seq, tid))
    graph: dict[int, set[int]] = {tid: set() for tid in committed}  # tid -> its predecessors

    def conflict(seq: int, tid: int, other_seq: int, other: int) -> None:
        if other != tid:
            first, then = (tid, other) if seq < other_seq else (other, tid)
            graph[then].add(first)

    for seq, (tid, kind, *args) in ops:
        if kind == "scan":
            lo, hi = args[0], args[1]
            touched = [w for key, ws in writes.items() if lo <= key <= hi for w in ws]
        else:
            touched = writes[args[0]]
        for other_seq, other in touched:
            conflict(seq, tid, other_seq, other)
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as err:
        raise AssertionError(f"not conflict-serializable: cycle {err.args[1]}") from None

    state = dict(initial)
    by_txn: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for _, entry in ops:
        by_txn[entry[0]].append(entry[1:])
    for tid in order:
        for kind, *args in by_txn[tid]:
            if kind == "read":
                assert state.get(args[0]) == args[1], (tid, kind, args)
            elif kind == "scan":
                lo, hi, seen = args
                assert tuple(sorted((k, v) for k, v in state.items() if lo <= k <= hi)) == seen
            elif args[1] is None:
                state.pop(args[0], None)
            else:
                state[args[0]] = args[1]
    assert state == final
    return order


def test_concurrent_transactions_are_serializable() -> None:
    history: list[tuple[Any, ...]] = []
    store = kvstore.KVStore(dict(INITIAL), history=history)
    attempts = run_threads(store)

    assert len(attempts) == THREADS * PER_THREAD  # every transaction committed in the end
    ends = [e[1] for e in history if e[1] in ("commit", "abort")]
    assert ends.count("commit") == THREADS * PER_THREAD
    assert ends.count("abort") == sum(attempts) - len(attempts)  # each retry followed an abort
    assert len(check_serializable(history, store.snapshot())) == THREADS * PER_THREAD
    assert store.locks.locks() == []
    assert store.index.keys() == sorted(store.snapshot())
    stats = store.locks.stats()
    assert stats.waits > 0  # they did get in each other's way


PHANTOM = [  # T1 scans [0, 10]: empty; T2 inserts 5 and commits; T1 reads 5
    (1, "scan", 0, 10, ()),
    (2, "write", 5, "two"),
    (2, "commit"),
    (1, "read", 5, "two"),
    (1, "commit"),
]
LOST_UPDATE = [  # both read 5, both write it
    (1, "read", 5, None),
    (2, "read", 5, None),
    (1, "write", 5, "one"),
    (1, "commit"),
    (2, "write", 5, "two"),
    (2, "commit"),
]


@pytest.mark.parametrize("history", [PHANTOM, LOST_UPDATE], ids=["phantom", "lost update"])
def test_the_checker_finds_a_cycle(history: list[tuple[Any, ...]]) -> None:
    with pytest.raises(AssertionError, match="cycle"):
        check_serializable(history, {5: "two"}, initial={})
    serial = [e for e in history if e[0] == 1] + [e for e in history if e[0] == 2]
    with pytest.raises(AssertionError):  # serial, but what T1 saw is not what T1 would see
        check_serializable(serial, {5: "two"}, initial={})


def test_an_insert_into_a_scanned_range_waits() -> None:
    store = kvstore.KVStore({10: "a", 20: "b", 30: "c"})
    scanner, writer = store.begin(), store.begin()
    assert scanner.scan(10, 20) == [(10, "a"), (20, "b")]
    with pytest.raises(LockTimeout):
        writer.put(15, "x")
    writer.abort()
    assert scanner.scan(10, 20) == [(10, "a"), (20, "b")]  # no phantom
    scanner.commit()
    store.run(lambda tx: tx.put(15, "x"))
    assert store.snapshot() == {10: "a", 15: "x", 20: "b", 30: "c"}


def test_delete_and_abort_leave_the_index_as_the_data() -> None:
    store = kvstore.KVStore({10: "a", 20: "b"})
    tx = store.begin()
    assert tx.delete(10) and not tx.delete(10) and not tx.delete(11)
    tx.put(15, "new")
    tx.put(10, "again")
    assert tx.get(10) == "again" and tx.scan(0) == [(10, "again"), (15, "new"), (20, "b")]
    tx.abort()
    assert store.snapshot() == {10: "a", 20: "b"} and store.index.keys() == [10, 20]
    tx = store.begin()
    tx.delete(20)
    other = store.begin()
    with pytest.raises((LockTimeout, Deadlock)):
        other.get(20)
    other.abort()
    tx.commit()
    assert store.index.keys() == [10] and store.locks.locks() == []
