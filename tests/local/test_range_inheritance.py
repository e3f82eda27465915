"""Locks moving with the index, range scans without phantoms, and their deadlocks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lockwarden import Deadlock, LockManager, LockTimeout, Mode
from lockwarden.local import SUPREMUM, Index, Kind, RangeMode, Txn
from tests.local.conftest import Attempt

S, X = Mode.S, Mode.X
REC, GAP, NK, II = Kind.RECORD, Kind.GAP, Kind.NEXT_KEY, Kind.INSERT_INTENTION


def keys(mgr: LockManager, *initial: int) -> Index:
    return mgr.index("pk", table=("t",), keys=initial or (10, 20, 30))


def on(mgr: LockManager, key: object) -> set[tuple[int, str, bool]]:
    """The range locks on one key: (owner, mode, granted)."""
    return {
        (i.owner, i.mode.value, i.granted)
        for i in mgr.locks()
        if i.kind == "range" and i.resource == ("pk", key)
    }


# -- scans: no phantoms--------------------------------------------------------------------


def test_an_insert_into_a_scanned_range_waits_for_the_scanner(mgr: LockManager) -> None:
    """A holds (10, 20] with an S next-key lock on 20: 15 waits for A, 25 does not."""
    idx = keys(mgr)
    a, b, c = mgr.begin(), mgr.begin(), mgr.begin()
    a.lock_key(idx, 20, NK, S)
    insert_15 = Attempt(b, b.insert, idx, 15, timeout=5).queued()
    c.insert(idx, 25, timeout=0)  # (20, 30) is not A's: no wait
    assert not insert_15.settle()
    assert 15 not in idx and mgr.waits_for() == {b.id: {a.id}}
    a.release_all()
    insert_15.join()
    assert idx.keys() == [10, 15, 20, 25, 30]


def test_a_range_scan_also_locks_the_gap_after_its_last_key(mgr: LockManager) -> None:
    """lock_range(10, 20) holds (prev, 20] and the gap (20, 30): 25 waits too, 35 does not."""
    idx = keys(mgr)
    a, b, c, d = (mgr.begin() for _ in range(4))
    assert a.lock_range(idx, 10, 20, S) == [10, 20]
    assert on(mgr, 30) == {(a.id, "gap", True)}
    insert_25 = Attempt(b, b.insert, idx, 25, timeout=5).queued()
    insert_5 = Attempt(c, c.insert, idx, 5, timeout=5).queued()  # the gap below 10 is held too
    d.insert(idx, 35, timeout=0)
    assert not insert_25.settle() and not insert_5.done
    a.release_all()
    insert_25.join()
    insert_5.join()
    assert idx.keys() == [5, 10, 20, 25, 30, 35]


def test_a_scan_to_the_end_locks_the_supremum(mgr: LockManager) -> None:
    idx = keys(mgr)
    a, b = mgr.begin(), mgr.begin()
    assert a.lock_range(idx, 25, SUPREMUM, X) == [30]
    assert on(mgr, SUPREMUM) == {(a.id, "gap", True)}
    with pytest.raises(LockTimeout):
        b.insert(idx, 99, timeout=0)


def test_a_scan_follows_keys_inserted_while_it_waited(mgr: LockManager) -> None:
    """An insert queued before the scan goes in below 20 while the scan waits there."""
    idx = keys(mgr)
    scanner, writer, gap, inserter = (mgr.begin() for _ in range(4))
    writer.lock_key(idx, 20, REC, X)
    gap.lock_key(idx, 20, GAP, S)
    ins = Attempt(inserter, inserter.insert, idx, 15, timeout=5).queued()  # waits for `gap`
    scan = Attempt(scanner, scanner.lock_range, idx, 11, 25, S, timeout=5).queued()
    gap.release_all()
    ins.join()  # granted: the scan's request behind it waits for the writer, not for the gap
    writer.release_all()
    assert not scan.settle()  # it got 20, saw 15 below it, and waits for the inserter's X
    assert mgr.waits_for() == {scanner.id: {inserter.id}}
    inserter.release_all()
    assert scan.join() == [15, 20]
    assert on(mgr, 15) == on(mgr, 20) == {(scanner.id, "S next-key", True)}
    assert on(mgr, 30) == {(scanner.id, "gap", True)}


def test_a_scan_follows_a_key_removed_while_it_waited(mgr: LockManager) -> None:
    idx = keys(mgr)
    scanner, writer = mgr.begin(), mgr.begin()
    writer.lock_key(idx, 20, REC, X)
    scan = Attempt(scanner, scanner.lock_range, idx, 11, 30, S, timeout=5).queued()
    idx.remove(20)  # the writer deleted it and committed
    writer.release_all()
    assert scan.join() == [30]
    assert on(mgr, 30) == {(scanner.id, "S next-key", True)}
    assert on(mgr, SUPREMUM) == {(scanner.id, "gap", True)}


# -- insert splits the gap ------------------------------------------------------------------


def test_an_insert_waits_for_gap_locks_on_the_next_key_not_for_records(mgr: LockManager) -> None:
    idx = keys(mgr)
    nk, gap, rec, ins = (mgr.begin() for _ in range(4))
    nk.lock_key(idx, 30, NK, S)
    gap.lock_key(idx, 30, GAP, X)
    rec.lock_key(idx, 30, REC, S)
    wait = Attempt(ins, ins.insert, idx, 25, timeout=5).queued()
    assert mgr.waits_for() == {ins.id: {nk.id, gap.id}}
    nk.release_all()
    assert not wait.settle()
    gap.release_all()
    wait.join()
    assert on(mgr, 25) == {(ins.id, "X record", True)}
    assert on(mgr, 30) == {(rec.id, "S record", True)}  # the insert intention was given back


def test_the_split_copies_the_inserters_gap_lock_to_the_new_key(mgr: LockManager) -> None:
    """It scanned the empty gap (20, 30), then inserts 25: both halves stay its own."""
    idx = keys(mgr)
    ins, other = mgr.begin(), mgr.begin()
    assert ins.lock_range(idx, 21, 29, X) == []  # a gap lock on 30
    ins.insert(idx, 25, timeout=0)
    assert on(mgr, 25) == {(ins.id, "X next-key", True)}
    assert on(mgr, 30) == {(ins.id, "gap", True)}
    for below_25_or_above in (22, 27):
        with pytest.raises(LockTimeout) as err:
            other.insert(idx, below_25_or_above, timeout=0)
        assert err.value.blockers == (ins.id,)


def test_two_scanners_of_a_gap_insert_one_after_the_other(mgr: LockManager) -> None:
    idx = keys(mgr)
    a, b, c = mgr.begin(), mgr.begin(), mgr.begin()
    a.lock_range(idx, 21, 29, S)
    b.lock_range(idx, 21, 29, S)
    with pytest.raises(LockTimeout) as err:
        b.insert(idx, 25, timeout=0)
    assert err.value.blockers == (a.id,)
    a.release_all()
    b.insert(idx, 25, timeout=0)
    assert on(mgr, 25) == {(b.id, "X next-key", True)}
    c.lock_range(idx, 21, 24, S)  # the gap (20, 25) now ends at 25
    assert on(mgr, 25) == {(b.id, "X next-key", True), (c.id, "gap", True)}


def test_the_insert_happens_when_its_intention_is_granted(mgr: LockManager) -> None:
    """Not when the inserter runs again: a scan that comes in between finds the key there."""
    idx = keys(mgr)
    holder, late, ins = mgr.begin(), mgr.begin(), mgr.begin()

    async def main() -> None:
        holder.lock_key(idx, 30, GAP, S)
        task = asyncio.create_task(ins.insert_async(idx, 25, timeout=5))
        while ins._waiting is None:
            await asyncio.sleep(0)
        holder.release_all()  # grants the intention; the inserting task has not run yet
        assert 25 in idx and on(mgr, 25) == {(ins.id, "X record", True)}
        with pytest.raises(LockTimeout) as err:  # the scan meets 25 and waits for its inserter
            late.lock_range(idx, 21, 29, S, timeout=0)
        assert err.value.resource == ("pk", 25)
        await task

    asyncio.run(main())
    assert on(mgr, 30) == set()  # the intention was given back


def test_an_insert_whose_gap_changed_while_it_waited_asks_again(mgr: LockManager) -> None:
    """Waiting on 30 to insert 22, it sees 25 arrive below 30: it asks on 25 instead."""
    idx = keys(mgr)
    gap, ins = mgr.begin(), mgr.begin()
    gap.lock_key(idx, 30, GAP, S)
    wait = Attempt(ins, ins.insert, idx, 22, timeout=5).queued()
    gap.insert(idx, 25, timeout=0)  # its own gap lock does not stop it; nothing waits for ins
    assert on(mgr, 25) == {(gap.id, "X next-key", True)}  # the gap (20, 25) is gap's too
    gap.release_all()
    wait.join()
    assert idx.keys() == [10, 20, 22, 25, 30]
    assert {(i.resource, i.mode.value) for i in mgr.locks() if i.kind == "range"} == {
        (("pk", 22), "X record")
    }


def test_an_insert_under_an_intention_it_holds_goes_in_at_once(mgr: LockManager) -> None:
    idx = keys(mgr)
    ins = mgr.begin()
    ins.lock_key(idx, 20, II, X)
    ins.insert(idx, 15, timeout=0)
    assert on(mgr, 15) == {(ins.id, "X record", True)}
    assert on(mgr, 20) == set()  # given back as well: it had done its job


# -- remove hands every lock to the next key ---------------------------------------------


def test_removal_hands_granted_locks_on_as_gap_locks(mgr: LockManager) -> None:
    idx = keys(mgr)
    r, n, g, ins = (mgr.begin() for _ in range(4))
    ins.lock_key(idx, 20, II, X)  # a granted intention protects nothing: dropped
    r.lock_key(idx, 20, REC, S)
    n.lock_key(idx, 20, NK, S)
    g.lock_key(idx, 20, GAP, X)
    idx.remove(20)
    assert on(mgr, 20) == set()
    assert on(mgr, 30) == {(r.id, "gap", True), (n.id, "gap", True), (g.id, "gap", True)}
    assert ins.held_key(idx, 30) is None and ins.held_key(idx, 20) is None
    with pytest.raises(LockTimeout) as err:  # the gap (10, 30) is theirs now
        ins.insert(idx, 15, timeout=0)
    assert set(err.value.blockers) == {r.id, n.id, g.id}


def test_removal_merges_with_a_lock_the_owner_has_on_the_next_key(mgr: LockManager) -> None:
    idx = keys(mgr)
    a = mgr.begin()
    a.lock_key(idx, 20, NK, X)
    a.lock_key(idx, 30, REC, S)
    idx.remove(20)
    assert on(mgr, 30) == {(a.id, "S next-key", True)}  # one lock per owner and key
    with pytest.raises(Exception, match="still holds 1 lock"):
        a.unlock(("t",))  # counted once under the table


def test_removal_of_the_last_key_hands_locks_to_the_supremum(mgr: LockManager) -> None:
    idx = keys(mgr)
    a, b = mgr.begin(), mgr.begin()
    a.lock_key(idx, 30, REC, S)
    idx.remove(30)
    assert on(mgr, SUPREMUM) == {(a.id, "gap", True)}
    with pytest.raises(LockTimeout):
        b.insert(idx, 40, timeout=0)


def test_a_waiting_request_moves_on_and_a_plain_one_is_granted_there(mgr: LockManager) -> None:
    """Waiting for the record 20, which goes away: the request becomes a gap lock on 30."""
    idx = keys(mgr)
    deleter, reader = mgr.begin(), mgr.begin()
    deleter.lock_key(idx, 20, REC, X)
    wait = Attempt(reader, reader.lock_key, idx, 20, NK, S, timeout=5).queued()
    idx.remove(20)  # the deleter commits: purge
    assert wait.join().value == "gap"
    assert on(mgr, 30) == {(deleter.id, "gap", True), (reader.id, "gap", True)}
    assert reader.held_key(idx, 20) is None


def test_a_waiting_insert_intention_stays_one_on_the_next_key(mgr: LockManager) -> None:
    """An insert below 20 waits; 20 goes away; it must now wait for the gap locks on 30."""
    idx = keys(mgr)
    gap20, gap30, ins = mgr.begin(), mgr.begin(), mgr.begin()
    gap20.lock_key(idx, 20, GAP, S)
    gap30.lock_key(idx, 30, GAP, S)
    wait = Attempt(ins, ins.insert, idx, 15, timeout=5).queued()
    idx.remove(20)
    assert not wait.settle()  # not granted as a gap lock: it is still an insert
    assert on(mgr, 30) == {
        (gap20.id, "gap", True),
        (gap30.id, "gap", True),
        (ins.id, "insert-intention", False),
    }
    assert mgr.waits_for() == {ins.id: {gap20.id, gap30.id}}
    gap20.release_all()
    assert not wait.settle()
    gap30.release_all()
    wait.join()
    assert idx.keys() == [10, 15, 30]
    assert on(mgr, 15) == {(ins.id, "X record", True)}


def test_a_waiter_moved_by_a_removal_queues_behind_the_waiters_there(mgr: LockManager) -> None:
    idx = keys(mgr)
    holder, first, ins = mgr.begin(), mgr.begin(), mgr.begin()
    holder.lock_key(idx, 30, REC, S)
    holder.lock_key(idx, 20, GAP, S)
    w1 = Attempt(first, first.lock_key, idx, 30, NK, X, timeout=5).queued()
    w2 = Attempt(ins, ins.insert, idx, 15, timeout=5).queued()
    idx.remove(20)
    waiting = [(i.owner, i.mode.value) for i in mgr.locks() if not i.granted]
    assert waiting == [(first.id, "X next-key"), (ins.id, "insert-intention")]
    holder.release_all()
    w1.join()
    assert not w2.settle()  # behind first's next-key lock, now granted
    first.release_all()
    w2.join()


# A removal between a grant and the granted call's return: the grant is made under the
# mutex by the releasing thread, and the waiting task runs only later. Asyncio tasks on one
# loop make that window exact: nothing runs between the release and the removal.


def granted_then_removed(
    mgr: LockManager, waiter: Txn, call: Any, removed: int, blocker_holds: Kind = GAP
) -> Any:
    """Start `call` (a coroutine of `waiter`), let it queue behind another txn's lock on
    `removed` (`blocker_holds`, in X), release that lock and remove `removed` before the call
    runs again."""
    idx = mgr.index("pk")
    blocker = mgr.begin()

    async def main() -> Any:
        blocker.lock_key(idx, removed, blocker_holds, X)
        task = asyncio.create_task(call)
        while waiter._waiting is None:
            assert not task.done(), "the call did not wait"
            await asyncio.sleep(0)
        blocker.release_all()  # grants the waiter's request on `removed`
        idx.remove(removed)  # hands it on before the waiting task has run
        return await task

    return asyncio.run(main())


def test_a_granted_insert_intention_dropped_before_its_call_returns(mgr: LockManager) -> None:
    """The insert went in at the grant; its intention on 20 is dropped by the removal."""
    idx = keys(mgr)
    ins = mgr.begin()
    granted_then_removed(mgr, ins, ins.insert_async(idx, 15, timeout=5), 20)
    assert idx.keys() == [10, 15, 30]
    assert {(i.resource, i.mode.value) for i in mgr.locks() if i.kind == "range"} == {
        (("pk", 15), "X record")
    }
    ins.release_all()
    assert mgr.locks() == []


def test_a_granted_request_merged_before_its_call_returns(mgr: LockManager) -> None:
    """The insert's intention on 20 meets the inserter's gap lock on 30: one request stays,
    and it is the one in the txn's books, released with the txn."""
    idx = keys(mgr)
    ins = mgr.begin()
    ins.lock_key(idx, 30, GAP, S)
    granted_then_removed(mgr, ins, ins.insert_async(idx, 15, timeout=5), 20)
    assert on(mgr, 30) == {(ins.id, "gap", True)}
    assert ins.held_key(idx, 30) is RangeMode.of(GAP, S)
    ins.release_all()
    assert mgr.locks() == []


def test_a_granted_scan_step_handed_on_before_its_call_returns(mgr: LockManager) -> None:
    """A scan of [20, 20] waits for the deleter's record lock on 20; granted its next-key lock,
    and 20 is purged: the scan goes on from the key above, and holds the merged gap."""
    idx = keys(mgr)
    scanner = mgr.begin()
    scanner.lock_key(idx, 30, GAP, S)
    keys_seen = granted_then_removed(
        mgr, scanner, scanner.lock_range_async(idx, 20, 20, X, timeout=5), 20, REC
    )
    assert keys_seen == []
    assert {(i.resource, i.mode.value) for i in mgr.locks() if i.owner == scanner.id} == {
        (("t",), "IX"),
        (("pk", 30), "gap"),
    }
    scanner.release_all()
    assert mgr.locks() == []


def test_a_lock_key_call_returns_what_it_was_granted(mgr: LockManager) -> None:
    """Granted an insert intention on 20, which then goes: the call says what it was granted,
    and the txn holds nothing there (a granted intention is dropped)."""
    idx = keys(mgr)
    txn = mgr.begin()
    granted = granted_then_removed(mgr, txn, txn.lock_key_async(idx, 20, II, X, timeout=5), 20)
    assert granted is RangeMode.of(II, X)
    assert txn.held_key(idx, 20) is None and txn.held_key(idx, 30) is None
    txn.release_all()
    assert mgr.locks() == []


def test_a_failed_call_gives_back_what_it_took_even_after_a_removal(mgr: LockManager) -> None:
    """A scan locks 20, waits on 30; 20 is removed: its lock is on 30 now, and goes on timeout."""
    idx = keys(mgr)
    scanner, writer = mgr.begin(), mgr.begin()
    scanner.lock_key(idx, 10, NK, S)  # before the call: stays
    writer.lock_key(idx, 30, REC, X)
    scan = Attempt(scanner, scanner.lock_range, idx, 15, 35, S, timeout=0.3).queued()
    assert scanner.held_key(idx, 20) is RangeMode.of(NK, S)
    idx.remove(20)
    assert on(mgr, 30) == {  # handed on from 20, merged with the waiting request there
        (writer.id, "X record", True),
        (scanner.id, "gap", True),
        (scanner.id, "S next-key", False),
    }
    with pytest.raises(LockTimeout):
        scan.join()
    assert {(i.resource, i.mode.value) for i in mgr.locks() if i.owner == scanner.id} == {
        (("t",), "IS"),
        (("pk", 10), "S next-key"),
    }


def test_a_lock_held_before_the_call_survives_its_failure_after_a_merge(
    mgr: LockManager,
) -> None:
    """20 was locked before the call; the call's own request on 30 absorbs it on removal."""
    idx = keys(mgr)
    txn, writer = mgr.begin(), mgr.begin()
    txn.lock_key(idx, 20, REC, S)
    writer.lock_key(idx, 30, REC, X)
    wait = Attempt(txn, txn.lock_key, idx, 30, NK, S, timeout=0.3).queued()
    idx.remove(20)
    with pytest.raises(LockTimeout):
        wait.join()
    assert txn.held_key(idx, 30) is RangeMode.of(GAP, S)  # what 20 became: still protected


def test_inherited_gap_locks_can_close_a_cycle_without_a_new_wait(mgr: LockManager) -> None:
    """A waits to insert below 30 (blocked by C); B waits for A's record. When 20 goes, B's
    gap lock below 20 moves to 30 and A now waits for B: a cycle no new wait created."""
    idx = keys(mgr)
    a, b, c = mgr.begin(), mgr.begin(), mgr.begin()
    a.lock_key(idx, 10, REC, X)
    b.lock_key(idx, 20, NK, S)
    c.lock_key(idx, 30, GAP, S)
    wa = Attempt(a, a.insert, idx, 25, timeout=5).queued()  # a waits for c
    wb = Attempt(b, b.lock_key, idx, 10, REC, S, timeout=5).queued()  # b waits for a
    assert mgr.waits_for() == {a.id: {c.id}, b.id: {a.id}}
    idx.remove(20)  # b's next-key on 20 becomes a gap lock on 30: a -> b -> a
    with pytest.raises(Deadlock) as err:
        wa.join()  # the search ran from a, the waiter on 30; a is the requester there
    assert set(err.value.cycle) == {a.id, b.id}
    assert mgr.stats().deadlocks == 1
    a.release_all()
    assert wb.join().value == "S record"


def test_an_insert_consumes_an_intention_held_before_it_even_if_it_fails(
    mgr: LockManager,
) -> None:
    """It gives its own intention on 20 back to ask afresh (and wait), then times out."""
    idx = keys(mgr)
    ins, gap = mgr.begin(), mgr.begin()
    ins.lock_key(idx, 20, II, X)
    gap.lock_key(idx, 20, GAP, S)  # granted: a gap lock waits for no intention
    with pytest.raises(LockTimeout) as err:
        ins.insert(idx, 15, timeout=0.05)
    assert err.value.blockers == (gap.id,)
    assert ins.held_key(idx, 20) is None
    assert on(mgr, 20) == {(gap.id, "gap", True)}


def test_a_failed_insert_keeps_what_a_removal_moved_into_its_request(mgr: LockManager) -> None:
    """The insert waits on the supremum; a removal moves its gap lock on 5 into that request;
    on timeout the gap lock stays (it was held before the call), the intention goes."""
    idx = keys(mgr, 5)
    other, ins = mgr.begin(), mgr.begin()
    ins.lock_key(idx, SUPREMUM, II, X)  # held before the call: the insert's
    ins.lock_key(idx, 5, GAP, S)
    other.lock_key(idx, SUPREMUM, GAP, S)  # a gap lock waits for no intention
    wait = Attempt(ins, ins.insert, idx, 15, timeout=0.3).queued()  # waits for `other`
    idx.remove(5)
    with pytest.raises(LockTimeout):
        wait.join()
    assert on(mgr, SUPREMUM) == {(other.id, "gap", True), (ins.id, "gap", True)}
    ins.release_all()
    other.release_all()
    assert mgr.locks() == []
