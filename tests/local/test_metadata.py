"""Metadata locks: taken before data locks, exclusive priority, bounded streak."""

from __future__ import annotations

import pytest

from lockwarden import LockManager, LockTimeout, LockUsageError, Mode, NotHeld
from tests.local.conftest import Attempt

S, X, IX = Mode.S, Mode.X, Mode.IX


def make(**kwargs: object) -> LockManager:
    return LockManager(
        metadata_locks=True,
        max_wait_timeout=None,
        max_ddl_wait_timeout=None,
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_data_lock_takes_the_shared_metadata_lock_first() -> None:
    mgr = make()
    txn = mgr.begin()
    txn.lock(("orders", 1), X)
    assert txn.held_metadata("orders") is S
    assert [(i.resource, i.mode, i.kind) for i in mgr.locks()] == [
        (("orders",), S, "metadata"),
        (("orders",), IX, "data"),
        (("orders", 1), X, "data"),
    ]
    txn.release_all()
    assert mgr.locks() == []


def test_ddl_waits_for_statements_and_new_statements_wait_for_ddl() -> None:
    mgr = make()
    dml, ddl, late = mgr.begin(), mgr.begin(), mgr.begin()
    dml.lock(("orders", 1), X)
    d = Attempt(ddl, ddl.lock_metadata, "orders", X, timeout=5).queued()
    # compatible with the granted S, but the waiting DDL has priority
    with pytest.raises(LockTimeout, match="metadata lock S"):
        late.lock(("orders", 2), S, timeout=0)
    assert late.held_metadata("orders") is None
    dml.release_all()
    assert d.join() is X


def test_exclusive_requests_go_ahead_of_waiting_shared_ones_until_the_streak_limit() -> None:
    mgr = make(metadata_exclusive_streak=2)
    holder = mgr.begin()
    holder.lock_metadata("t", X)
    reader, w2, w3, w4 = (mgr.begin() for _ in range(4))
    r = Attempt(reader, reader.lock_metadata, "t", S, timeout=5).queued()
    a2 = Attempt(w2, w2.lock_metadata, "t", X, timeout=5).queued()
    a3 = Attempt(w3, w3.lock_metadata, "t", X, timeout=5).queued()
    a4 = Attempt(w4, w4.lock_metadata, "t", X, timeout=5).queued()
    order = [i.owner for i in mgr.locks() if not i.granted]
    assert order == [w2.id, w3.id, w4.id, reader.id]  # exclusive first

    grants = []
    for txn, attempt in [(holder, None), (w2, a2), (w3, a3), (reader, r), (w4, a4)]:
        if attempt is not None:
            assert attempt.join() is not None
            grants.append(txn.id)
        txn.release_all()
    # two exclusive grants in a row while the reader waited; then the reader goes first
    assert grants == [w2.id, w3.id, reader.id, w4.id]


def test_strict_mode_requires_the_metadata_lock() -> None:
    mgr = LockManager(metadata_locks=True, strict=True)
    txn = mgr.begin()
    with pytest.raises(LockUsageError, match="metadata lock"):
        txn.lock(("orders",), IX)
    txn.lock_metadata("orders", S)
    assert txn.lock(("orders",), IX) is IX


def test_metadata_lock_misuse() -> None:
    with pytest.raises(LockUsageError, match="metadata_locks=True"):
        LockManager().begin().lock_metadata("orders", X)
    mgr = make()
    txn = mgr.begin()
    with pytest.raises(LockUsageError, match="S \\(use\\) or X \\(DDL\\)"):
        txn.lock_metadata("orders", IX)
    txn.lock(("orders", 1), S)
    with pytest.raises(LockUsageError, match="still holds data locks"):
        txn.unlock_metadata("orders")
    txn.unlock(("orders", 1))
    txn.unlock(("orders",))
    txn.unlock_metadata("orders")
    assert mgr.locks() == []
    with pytest.raises(NotHeld, match="holds no metadata lock"):
        txn.unlock_metadata("orders")


def test_exclusive_metadata_locks_wait_like_ddl() -> None:
    mgr = LockManager(metadata_locks=True, ddl_wait_timeout=0.01, wait_timeout=0.02)
    a, b = mgr.begin(), mgr.begin()
    a.lock_metadata("t", S)
    with pytest.raises(LockTimeout) as err:
        b.lock_metadata("t", X)
    assert err.value.timeout == 0.01
    a.release_all()
    a.lock_metadata("t", X)
    with pytest.raises(LockTimeout) as err:
        b.lock_metadata("t", S)
    assert err.value.timeout == 0.02


def test_a_metadata_lock_is_no_data_lock_s_child() -> None:
    """A table named by a tuple: its metadata lock does not count under the table named by
    that tuple's first part."""
    mgr = make()
    txn = mgr.begin()
    txn.lock(("a",), IX)
    txn.lock((("a", "b"), 1), X)  # metadata S on ("a", "b"), then IX and X
    txn.unlock((("a", "b"), 1))
    txn.unlock((("a", "b"),))
    txn.unlock(("a",))  # nothing is under it
    assert txn.held(("a",)) is None
