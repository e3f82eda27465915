"""Lock escalation: many row locks become one table lock, if that need not wait."""

from __future__ import annotations

import pytest

from lockwarden import LockManager, Mode, NotHeld

S, X, IS, IX, SIX = Mode.S, Mode.X, Mode.IS, Mode.IX, Mode.SIX


def table_entries(mgr: LockManager) -> list[tuple[object, Mode]]:
    return [(i.resource, i.mode) for i in mgr.locks()]


@pytest.mark.parametrize(("row_mode", "table_mode"), [(X, X), (S, S)])
def test_crossing_the_threshold_escalates(row_mode: Mode, table_mode: Mode) -> None:
    mgr = LockManager(escalation_threshold=10)
    txn = mgr.begin()
    for i in range(10):
        txn.lock(("t", i), row_mode)
    assert len(mgr.locks()) == 11 and mgr.stats().escalations == 0
    txn.lock(("t", 10), row_mode)  # the 11th: more than the threshold
    assert table_entries(mgr) == [(("t",), table_mode)]
    assert mgr.stats().escalations == 1
    assert txn.held(("t", 3)) is table_mode
    assert txn.lock(("t", 99), row_mode) is table_mode  # covered: nothing new is locked
    assert len(mgr.locks()) == 1
    with pytest.raises(NotHeld, match="escalation"):
        txn.unlock(("t", 3))


def test_mixed_rows_escalate_to_the_join() -> None:
    mgr = LockManager(escalation_threshold=3)
    txn = mgr.begin()
    txn.lock(("t",), S)
    for i in range(4):
        txn.lock(("t", i), X)  # table S + IX = SIX, rows X
    assert table_entries(mgr) == [(("t",), X)]


def test_escalation_that_would_wait_keeps_the_rows_and_retries_later() -> None:
    mgr = LockManager(escalation_threshold=5, escalation_retry=3)
    other, txn = mgr.begin(), mgr.begin()
    other.lock(("t", 100), S)  # IS on the table: table X would have to wait
    for i in range(6):
        txn.lock(("t", i), X)
    assert mgr.stats().escalations == 0
    assert len([i for i in mgr.locks() if i.owner == txn.id]) == 7  # 6 rows + IX
    other.release_all()
    txn.lock(("t", 6), X)
    txn.lock(("t", 7), X)
    assert mgr.stats().escalations == 0  # not retried before 3 more rows
    txn.lock(("t", 8), X)
    assert mgr.stats().escalations == 1
    assert table_entries(mgr) == [(("t",), X)]


def test_escalation_wakes_nothing_it_should_not() -> None:
    mgr = LockManager(escalation_threshold=3)
    reader, txn = mgr.begin(), mgr.begin()
    reader.lock(("t", 50), S)
    for i in range(4):
        txn.lock(("t", i), S)  # IS→S on the table is compatible with the reader's IS
    assert mgr.stats().escalations == 1
    assert sorted(table_entries(mgr), key=str) == sorted(
        [(("t",), IS), (("t",), S), (("t", 50), S)], key=str
    )


def test_none_disables_escalation() -> None:
    mgr = LockManager(escalation_threshold=None)
    txn = mgr.begin()
    for i in range(6000):
        txn.lock(("t", i), X)
    assert len(mgr.locks()) == 6001
    assert mgr.stats().escalations == 0
    txn.release_all()
    assert mgr.locks() == []


def test_escalation_under_a_solo_table_lock() -> None:
    """Three levels: the table lock itself may be uncontended (a solo lock) when it escalates."""
    mgr = LockManager(levels=("db", "table", "row"), escalation_threshold=3)
    txn = mgr.begin()
    for i in range(4):
        txn.lock(("db", "t", i), X)
    assert table_entries(mgr) == [(("db",), IX), (("db", "t"), X)]
    txn.release_all()
    assert mgr.locks() == [] and mgr._queues == {}
