"""Range locks on an ordered index: the conflicts between two owners, their table, their checks."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from lockwarden import Deadlock, LockManager, LockTimeout, LockUsageError, Mode, NotHeld
from lockwarden.local import SUPREMUM, Index, Kind, RangeMode
from tests.local.conftest import Attempt

S, X, IS, IX = Mode.S, Mode.X, Mode.IS, Mode.IX
REC, GAP, NK, II = Kind.RECORD, Kind.GAP, Kind.NEXT_KEY, Kind.INSERT_INTENTION
REQUESTS = [(kind, mode) for kind in Kind for mode in (S, X)]

# The conflict rule written out: does a request (row) wait for another owner's lock (column)?
# R = record only, G = gap, N = next-key, I = insert intention; then S or X.
TABLE = """
        RS RX GS GX NS NX IS IX
    RS  .  W  .  .  .  W  .  .
    RX  W  W  .  .  W  W  .  .
    GS  .  .  .  .  .  .  .  .
    GX  .  .  .  .  .  .  .  .
    NS  .  W  .  .  .  W  .  .
    NX  W  W  .  .  W  W  .  .
    IS  .  .  W  W  W  W  .  .
    IX  .  .  W  W  W  W  .  .
"""
_LETTERS = {"R": REC, "G": GAP, "N": NK, "I": II}


def _waits() -> dict[tuple[tuple[Kind, Mode], tuple[Kind, Mode]], bool]:
    lines = TABLE.split("\n")[1:-1]
    held = [(_LETTERS[c[0]], Mode(c[1])) for c in lines[0].split()]
    out = {}
    for line in lines[1:]:
        name, *cells = line.split()
        wanted = (_LETTERS[name[0]], Mode(name[1]))
        for column, cell in zip(held, cells, strict=True):
            out[wanted, column] = cell == "W"
    return out


WAITS = _waits()


def index_of(mgr: LockManager, *keys: int) -> Index:
    return mgr.index("pk", keys=keys or (10, 20, 30))


def range_entries(mgr: LockManager) -> set[tuple[object, int, str, bool]]:
    return {
        (i.resource, i.owner, i.mode.value, i.granted) for i in mgr.locks() if i.kind == "range"
    }


# -- the compatibility table ------------------------------------------------------------


@pytest.mark.parametrize(("held", "wanted"), list(itertools.product(REQUESTS, REQUESTS)))
def test_two_owners_on_one_key_follow_the_table(
    mgr: LockManager, held: tuple[Kind, Mode], wanted: tuple[Kind, Mode]
) -> None:
    idx = index_of(mgr)
    a, b = mgr.begin(), mgr.begin()
    a.lock_key(idx, 20, *held)
    if WAITS[wanted, held]:
        with pytest.raises(LockTimeout) as err:
            b.lock_key(idx, 20, *wanted, timeout=0)
        assert err.value.blockers == (a.id,)
        assert err.value.resource == ("pk", 20)
        assert b.held_key(idx, 20) is None
    else:
        assert b.lock_key(idx, 20, *wanted, timeout=0) is RangeMode.of(*wanted)
        assert b.held_key(idx, 20) is RangeMode.of(*wanted)


@pytest.mark.parametrize(("first", "second"), list(itertools.product(REQUESTS, REQUESTS)))
def test_one_owner_never_waits_for_itself_and_holds_the_join(
    mgr: LockManager, first: tuple[Kind, Mode], second: tuple[Kind, Mode]
) -> None:
    idx = index_of(mgr)
    a = mgr.begin()
    a.lock_key(idx, 20, *first)
    held = a.lock_key(idx, 20, *second, timeout=0)
    one, two = RangeMode.of(*first), RangeMode.of(*second)
    records = [m.record for m in (one, two) if m.record is not None]
    assert held.record is (X if X in records else S if records else None)
    assert held.gap == (one.gap or two.gap)
    assert held.insert_intention == (one.insert_intention or two.insert_intention)
    assert range_entries(mgr) == {(("pk", 20), a.id, held.value, True)}  # one lock


def test_the_mode_names_say_what_is_locked() -> None:
    assert [RangeMode.of(k, m).value for k, m in REQUESTS] == [
        "S record", "X record", "gap", "gap", "S next-key", "X next-key",
        "insert-intention", "insert-intention",
    ]  # fmt: skip
    assert RangeMode.of(NK, X).join(RangeMode.of(II, S)).value == "X next-key+insert-intention"


@pytest.mark.parametrize("held", [r for r in REQUESTS if r[0] is not REC])
@pytest.mark.parametrize("wanted", [r for r in REQUESTS if r[0] is not REC])
def test_on_the_supremum_only_an_insert_intention_waits(
    mgr: LockManager, held: tuple[Kind, Mode], wanted: tuple[Kind, Mode]
) -> None:
    """The supremum has no record: every lock there is a gap lock (or an intention)."""
    idx = index_of(mgr)
    a, b = mgr.begin(), mgr.begin()
    a.lock_key(idx, SUPREMUM, *held)
    waits = wanted[0] is II and held[0] is not II
    if waits:
        with pytest.raises(LockTimeout):
            b.lock_key(idx, SUPREMUM, *wanted, timeout=0)
    else:
        b.lock_key(idx, SUPREMUM, *wanted, timeout=0)
    assert all(i.mode.record is None for i in mgr.locks())


def test_no_request_is_granted_ahead_of_a_waiter_it_would_wait_for(mgr: LockManager) -> None:
    """No grant past a waiting request it would wait for, with one-way conflicts.

    What waits for a waiting request queues behind it.
    """
    idx = index_of(mgr)
    holder, writer, reader, inserter, gapper = (mgr.begin() for _ in range(5))
    holder.lock_key(idx, 20, REC, S)
    w = Attempt(writer, writer.lock_key, idx, 20, NK, X, timeout=5).queued()
    # compatible with the granted S record, but not with the X next-key waiting ahead
    with pytest.raises(LockTimeout) as err:
        reader.lock_key(idx, 20, REC, S, timeout=0)
    assert err.value.blockers == (writer.id,)
    with pytest.raises(LockTimeout) as err:  # waits for the gap part of the waiter
        inserter.lock_key(idx, 20, II, X, timeout=0)
    assert err.value.blockers == (writer.id,)
    assert gapper.lock_key(idx, 20, GAP, X, timeout=0).value == "gap"  # a gap waits for nothing
    holder.release_all()
    assert w.join().value == "X next-key"
    assert mgr.waits_for() == {}


def test_a_release_grants_past_a_waiting_insert_that_blocks_nothing(mgr: LockManager) -> None:
    """The walk does not stop at a waiter that still waits: nothing waits for an intention."""
    idx = index_of(mgr)
    gap, ins, writer, reader = (mgr.begin() for _ in range(4))
    gap.lock_key(idx, 20, GAP, S)
    writer.lock_key(idx, 20, REC, X)
    wi = Attempt(ins, ins.lock_key, idx, 20, II, X, timeout=5).queued()  # waits for the gap
    wr = Attempt(reader, reader.lock_key, idx, 20, REC, S, timeout=5).queued()  # for the X
    writer.release_all()
    assert wr.join().value == "S record"  # granted past the insert still waiting
    assert not wi.done
    gap.release_all()
    assert wi.join().value == "insert-intention"


def test_a_granted_insert_intention_makes_nobody_wait_but_waits_for_later_gap_locks(
    mgr: LockManager,
) -> None:
    idx = index_of(mgr)
    a, b, c = mgr.begin(), mgr.begin(), mgr.begin()
    a.lock_key(idx, 20, II, X)
    assert b.lock_key(idx, 20, NK, X, timeout=0).value == "X next-key"
    gap = c.lock_key(idx, 20, GAP, S, timeout=0)
    # a's intention is granted; a new one from c (who holds a gap lock) waits for b's gap
    with pytest.raises(LockTimeout) as err:
        c.lock_key(idx, 20, II, X, timeout=0)
    assert err.value.blockers == (b.id,)
    assert c.held_key(idx, 20) is gap


# -- tables, introspection, misuse ---------------------------------------------------


def test_range_locks_take_the_intention_lock_of_the_table(mgr: LockManager) -> None:
    idx = mgr.index("orders_pk", table=("orders",), keys=[1, 2, 3])
    reader, writer = mgr.begin(), mgr.begin()
    reader.lock_range(idx, 1, 2, S)
    writer.lock_key(idx, 3, REC, X)
    assert reader.held(("orders",)) is IS
    assert writer.held(("orders",)) is IX
    with pytest.raises(LockUsageError, match="still holds 3 lock"):
        reader.unlock(("orders",))  # 1 and 2 next-key, 3 gap: children of the table
    ddl = mgr.begin()
    with pytest.raises(LockTimeout):
        ddl.lock(("orders",), X, timeout=0)
    writer.unlock_key(idx, 3)
    writer.unlock(("orders",))
    reader.release_all()
    assert ddl.lock(("orders",), X, timeout=0) is X


def test_a_table_lock_covers_range_locks_and_blocks_inserts(mgr: LockManager) -> None:
    idx = mgr.index("orders_pk", table=("orders",), keys=[1, 2, 3])
    reader, inserter = mgr.begin(), mgr.begin()
    reader.lock(("orders",), S)
    assert reader.lock_range(idx, 1, 3, S) == [1, 2, 3]
    assert reader.lock_key(idx, 2, NK, S).value == "S next-key"
    assert [i.kind for i in mgr.locks()] == ["data"]  # implied by table S: nothing more
    with pytest.raises(LockTimeout) as err:  # an insert needs IX on the table
        inserter.insert(idx, 5, timeout=0)
    assert err.value.resource == ("orders",)
    assert 5 not in idx
    reader.lock_key(idx, 2, REC, X)  # a write: IX joins S to SIX, then the key itself
    assert reader.held(("orders",)) is Mode.SIX


def test_under_an_x_table_lock_an_insert_takes_no_range_lock(mgr: LockManager) -> None:
    idx = mgr.index("orders_pk", table=("orders",), keys=[1, 2, 3])
    owner, other = mgr.begin(), mgr.begin()
    owner.lock(("orders",), X)
    owner.insert(idx, 5, timeout=0)
    assert idx.keys() == [1, 2, 3, 5]
    assert [(i.resource, i.mode) for i in mgr.locks()] == [(("orders",), X)]
    with pytest.raises(LockUsageError, match="already in index"):
        owner.insert(idx, 5)
    with pytest.raises(LockTimeout):
        other.lock_range(idx, 1, 9, S, timeout=0)


def test_snapshot_and_waits_for_show_range_locks(mgr: LockManager) -> None:
    idx = index_of(mgr)
    a, b = mgr.begin(), mgr.begin()
    a.lock_key(idx, 20, NK, S)
    w = Attempt(b, b.insert, idx, 15, timeout=5).queued()
    assert range_entries(mgr) == {
        (("pk", 20), a.id, "S next-key", True),
        (("pk", 20), b.id, "insert-intention", False),
    }
    assert mgr.waits_for() == {b.id: {a.id}}
    a.release_all()
    w.join()
    assert range_entries(mgr) == {(("pk", 15), b.id, "X record", True)}


def test_misuse_is_refused_with_what_to_do(mgr: LockManager) -> None:
    idx = index_of(mgr)
    txn = mgr.begin()
    with pytest.raises(LockUsageError, match="intention modes are for tables"):
        txn.lock_key(idx, 20, NK, IX)
    with pytest.raises(LockUsageError, match="not in index 'pk': lock the gap"):
        txn.lock_key(idx, 15, NK, S)
    with pytest.raises(LockUsageError, match="comparable"):
        txn.lock_key(idx, "20", NK, S)
    with pytest.raises(LockUsageError, match="hashable"):
        txn.lock_range(idx, [1], 20, S)
    with pytest.raises(LockUsageError, match="not a record"):
        txn.lock_key(idx, SUPREMUM, REC, S)
    with pytest.raises(LockUsageError, match="unknown kind"):
        txn.lock_key(idx, 20, "phantom", S)
    with pytest.raises(LockUsageError, match="empty range"):
        txn.lock_range(idx, 30, 10, S)
    with pytest.raises(LockUsageError, match="already in index"):
        txn.insert(idx, 20)
    with pytest.raises(LockUsageError, match="not in index 'pk'; only keys"):
        idx.remove(15)
    with pytest.raises(NotHeld, match="holds no range lock"):
        txn.unlock_key(idx, 20)
    with pytest.raises(LockUsageError, match="exists"):
        mgr.index("pk", table=("t",))
    with pytest.raises(LockUsageError, match="not an index of this txn's manager"):
        txn.lock_key(LockManager().index("pk", keys=[20]), 20, NK, S)
    assert mgr.index("pk") is idx
    assert txn.lock_key(idx, 20, "next-key", "read").value == "S next-key"  # spellings
    assert mgr.locks()[0].resource == ("pk", 20)


def test_the_index_reads_like_a_sorted_set(mgr: LockManager) -> None:
    idx = mgr.index("names", keys=["b", "d", "a", "b"])
    assert (len(idx), idx.keys(), "d" in idx, "c" in idx) == (3, ["a", "b", "d"], True, False)
    assert (idx.next_key("b"), idx.next_key("c"), idx.next_key("d")) == ("d", "d", SUPREMUM)
    assert idx.keys("b", "c") == ["b"]
    assert sorted(["b", SUPREMUM, "a"]) == ["a", "b", SUPREMUM] and not SUPREMUM < "a"
    assert repr(idx) == "<Index 'names': 3 keys>"


def test_a_range_deadlock_is_detected_like_any_other(mgr: LockManager) -> None:
    """Two owners each hold the gap below 20 and both insert into it: exactly one Deadlock."""
    idx = index_of(mgr)
    a, b = mgr.begin(), mgr.begin()
    a.lock_key(idx, 20, GAP, S)
    b.lock_key(idx, 20, GAP, S)
    wa = Attempt(a, a.insert, idx, 12, timeout=5).queued()
    with pytest.raises(Deadlock) as err:
        b.insert(idx, 15, timeout=5)
    assert set(err.value.cycle) == {a.id, b.id}
    assert err.value.resource == ("pk", 20)
    assert b.held_key(idx, 20) is RangeMode.of(GAP, S)  # its granted gap lock stays
    b.release_all()
    wa.join()
    assert idx.keys() == [10, 12, 20, 30]
    assert mgr.stats().deadlocks == 1


def test_strict_and_metadata_rules_apply_to_range_locks() -> None:
    strict = LockManager(strict=True)
    idx = strict.index("pk", table=("orders",), keys=[1])
    txn = strict.begin()
    with pytest.raises(LockUsageError, match=r"strict mode: lock \('orders',\) in IS"):
        txn.lock_key(idx, 1, NK, S)
    txn.lock(("orders",), IS)
    assert txn.lock_key(idx, 1, NK, S).value == "S next-key"

    meta = LockManager(metadata_locks=True)
    idx = meta.index("pk", table=("orders",), keys=[1])
    txn = meta.begin()
    txn.insert(meta.index("pk"), 2)
    assert txn.held_metadata("orders") is S
    assert [(i.kind, i.resource) for i in meta.locks()] == [
        ("metadata", ("orders",)),
        ("data", ("orders",)),
        ("range", ("pk", 2)),
    ]


def test_range_locks_escalate_with_the_rows_of_their_table() -> None:
    mgr = LockManager(escalation_threshold=10)
    idx = mgr.index("pk", table=("t",), keys=range(20))
    reader, writer = mgr.begin(), mgr.begin()
    assert reader.lock_range(idx, 0, 8, S) == list(range(9))  # 10 locks: not more than 10
    assert mgr.stats().escalations == 0
    reader.lock_range(idx, 9, 9, S)  # 11: the scan ends, then the table lock replaces them
    assert [(i.resource, i.mode) for i in mgr.locks()] == [(("t",), S)]
    with pytest.raises(LockTimeout):
        writer.insert(idx, 100, timeout=0)  # IX on the table waits for S
    reader.release_all()
    writer.lock_key(idx, 1, REC, X)
    for key in range(2, 12):
        writer.lock_key(idx, key, REC, S)
    assert [(i.resource, i.mode) for i in mgr.locks()] == [(("t",), X)]  # one key written


def test_a_cancelled_range_scan_gives_back_what_it_took(mgr: LockManager) -> None:
    idx = index_of(mgr)
    scanner, writer = mgr.begin(), mgr.begin()
    writer.lock_key(idx, 20, REC, X)

    async def main() -> None:
        task = asyncio.create_task(scanner.lock_range_async(idx, 10, 30, S, timeout=5))
        while scanner._waiting is None:
            await asyncio.sleep(0)
        assert scanner.held_key(idx, 10) is RangeMode.of(NK, S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        writer.release_all()
        assert await scanner.lock_range_async(idx, 10, 30, S, timeout=0) == [10, 20, 30]

    asyncio.run(main())
    assert {i.owner for i in mgr.locks()} == {scanner.id}
