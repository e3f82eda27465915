"""Hierarchy, re-requests, unlocking and input checks of the in-process manager."""

from __future__ import annotations

import itertools
import math
import time

import pytest

from lockwarden import LockManager, LockTimeout, LockUsageError, Mode, NotHeld

IS, IX, S, SIX, X = Mode.IS, Mode.IX, Mode.S, Mode.SIX, Mode.X
T = ("orders",)


def entries(mgr: LockManager) -> set[tuple[object, int, Mode, bool]]:
    return {(i.resource, i.owner, i.mode, i.granted) for i in mgr.locks()}


@pytest.mark.parametrize(("held", "wanted"), list(itertools.product(Mode, Mode)))
def test_two_owners_coexist_exactly_when_the_modes_are_compatible(
    mgr: LockManager, held: Mode, wanted: Mode
) -> None:
    a, b = mgr.begin(), mgr.begin()
    a.lock(T, held)
    if held.compatible(wanted):
        assert b.lock(T, wanted, timeout=0) is wanted
        assert {(i.owner, i.mode) for i in mgr.locks()} == {(a.id, held), (b.id, wanted)}
    else:
        with pytest.raises(LockTimeout) as err:
            b.lock(T, wanted, timeout=0)
        assert err.value.blockers == (a.id,)
        assert entries(mgr) == {(T, a.id, held, True)}


@pytest.mark.parametrize(
    ("first", "second", "held"),
    [(IX, S, SIX), (S, IS, S), (IS, X, X), (S, IX, SIX), (SIX, S, SIX), (IX, IX, IX), (X, IS, X)],
)
def test_a_rerequest_is_resolved_with_the_lattice(
    mgr: LockManager, first: Mode, second: Mode, held: Mode
) -> None:
    txn = mgr.begin()
    txn.lock(T, first)
    assert txn.lock(T, second) is held
    assert txn.held(T) is held
    assert entries(mgr) == {(T, txn.id, held, True)}  # still one lock, nothing queued


def test_row_locks_take_intention_locks_on_ancestors(mgr: LockManager) -> None:
    txn = mgr.begin()
    txn.lock(("orders", 42), X)
    txn.lock(("items", 7), S)
    assert txn.held(T) is IX
    assert txn.held(("items",)) is IS
    # each intention lock is an entry of its own in the snapshot
    assert entries(mgr) == {
        (T, txn.id, IX, True),
        (("orders", 42), txn.id, X, True),
        (("items",), txn.id, IS, True),
        (("items", 7), txn.id, S, True),
    }


def test_a_write_under_a_read_upgrades_the_parent_to_six(mgr: LockManager) -> None:
    txn = mgr.begin()
    txn.lock(T, S)
    txn.lock(("orders", 1), X)
    assert txn.held(T) is SIX
    assert txn.held(("orders", 1)) is X


def test_deeper_hierarchies_lock_every_ancestor_root_to_leaf() -> None:
    mgr = LockManager(levels=("db", "table", "page", "row"))
    txn = mgr.begin()
    txn.lock(("db", "t", 3, 9), X)
    assert [(i.resource, i.mode) for i in mgr.locks()] == [
        (("db",), IX),
        (("db", "t"), IX),
        (("db", "t", 3), IX),
        (("db", "t", 3, 9), X),
    ]


def test_a_lock_covered_by_an_ancestor_adds_nothing(mgr: LockManager) -> None:
    txn = mgr.begin()
    txn.lock(T, S)
    assert txn.lock(("orders", 1), S) is S  # implied by S on the table
    assert entries(mgr) == {(T, txn.id, S, True)}
    assert txn.held(("orders", 1)) is S
    with pytest.raises(NotHeld, match=r"only through its S lock on \('orders',\)"):
        txn.unlock(("orders", 1))


def test_strict_mode_requires_the_intention_locks() -> None:
    mgr = LockManager(strict=True)
    txn = mgr.begin()
    with pytest.raises(LockUsageError, match=r"lock \('orders',\) in IX or stronger"):
        txn.lock(("orders", 1), X)
    txn.lock(T, IS)
    with pytest.raises(LockUsageError, match="IX or stronger"):
        txn.lock(("orders", 1), X)  # IS does not allow writing below
    assert txn.lock(("orders", 1), S) is S
    assert entries(mgr) == {(T, txn.id, IS, True), (("orders", 1), txn.id, S, True)}


@pytest.mark.parametrize("mode", [IS, IX, SIX])
def test_only_s_and_x_are_allowed_on_the_last_level(mgr: LockManager, mode: Mode) -> None:
    txn = mgr.begin()
    with pytest.raises(LockUsageError, match="last level"):
        txn.lock(("orders", 1), mode)
    assert mgr.locks() == []


def test_unlocking_a_parent_with_children_held_changes_nothing(mgr: LockManager) -> None:
    txn = mgr.begin()
    txn.lock(("orders", 1), X)
    before = entries(mgr)
    with pytest.raises(LockUsageError, match=r"still holds 1 lock\(s\) under"):
        txn.unlock(T)
    assert entries(mgr) == before
    txn.unlock(("orders", 1))
    txn.unlock(T)
    assert mgr.locks() == []


def test_unlocking_what_is_not_held_changes_nothing(mgr: LockManager) -> None:
    a, b = mgr.begin(), mgr.begin()
    a.lock(("orders", 1), X)
    before = entries(mgr)
    with pytest.raises(NotHeld, match="holds no lock"):
        b.unlock(("orders", 1))
    with pytest.raises(NotHeld, match="holds no lock"):
        a.unlock(("orders", 2))
    assert entries(mgr) == before


def test_unlock_then_relock(mgr: LockManager) -> None:
    txn = mgr.begin()
    for _ in range(3):
        txn.lock(("orders", 1), X)
        txn.unlock(("orders", 1))
    assert txn.held(("orders", 1)) is None
    assert entries(mgr) == {(T, txn.id, IX, True)}


def test_release_all_and_the_context_manager(mgr: LockManager) -> None:
    with mgr.begin() as txn:
        for i in range(10):
            txn.lock(("orders", i), X)
        txn.lock(("items",), S)
        assert len(mgr.locks()) == 12
    assert mgr.locks() == []
    assert mgr._queues == {}  # queues exist only while locked


def test_modes_may_be_given_by_name(mgr: LockManager) -> None:
    txn = mgr.begin()
    assert txn.lock(("orders", 1), "write") is X
    assert txn.lock(("orders", 2), "s") is S
    with pytest.raises(LockUsageError, match="unknown lock mode"):
        txn.lock(("orders", 3), "upgrade")


@pytest.mark.parametrize(
    "resource",
    [(), "orders", ["orders", 1], ("orders", 1, 2), ("orders", [1]), None],
)
def test_bad_resources_are_usage_errors(mgr: LockManager, resource: object) -> None:
    txn = mgr.begin()
    with pytest.raises(LockUsageError):
        txn.lock(resource, X)  # type: ignore[arg-type]
    assert mgr.locks() == []


@pytest.mark.parametrize("timeout", [-1, math.nan, "1", True])
def test_bad_timeouts_are_usage_errors(mgr: LockManager, timeout: object) -> None:
    with pytest.raises(LockUsageError):
        mgr.begin().lock(("orders", 1), X, timeout=timeout)  # type: ignore[arg-type]
    assert mgr.locks() == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"levels": ()},
        {"levels": ("table", "")},
        {"victim": "oldest"},
        {"deadlock_max_depth": 0},
        {"escalation_threshold": 0},
        {"wait_timeout": 1.0},  # above the default maximum 0.6
        {"ddl_wait_timeout": -1},
        {"max_wait_timeout": math.nan},
        {"max_ddl_wait_timeout": math.inf},
        {"strict": 1},
        {"metadata_locks": "yes"},
    ],
)
def test_bad_manager_settings_are_usage_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(LockUsageError):
        LockManager(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("wait_timeout", -5),
        ("wait_timeout", 0.1),
        ("escalation_threshold", 10),
        ("victim", "youngest"),
    ],
)
def test_settings_are_read_only(setting: str, value: object) -> None:
    mgr = LockManager()
    before = getattr(mgr, setting)
    with pytest.raises(AttributeError):
        setattr(mgr, setting, value)
    assert getattr(mgr, setting) == before


def test_none_waits_up_to_the_class_maximum_and_a_default_of_none_too() -> None:
    mgr = LockManager(wait_timeout=None, max_wait_timeout=0.1)
    holder, waiter = mgr.begin(), mgr.begin()
    holder.lock(("orders", 1), X)
    for call in (
        lambda: waiter.lock(("orders", 1), X, timeout=None),
        lambda: waiter.lock(("orders", 1), X),
    ):
        with pytest.raises(LockTimeout) as err:
            call()
        assert err.value.timeout == 0.1
    assert mgr.wait_timeout is None


def test_txn_ids_grow_in_begin_order() -> None:
    mgr = LockManager()
    ids = [mgr.begin().id for _ in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert "Txn 1 'x'" in repr(LockManager().begin("x"))


def test_the_uncontended_path_takes_a_released_parent_again(mgr: LockManager) -> None:
    txn, other = mgr.begin(), mgr.begin()
    txn.lock(("orders",), IX)
    txn.lock(("orders", 1), X)  # the parent is remembered for the next row...
    txn.unlock(("orders", 1))
    txn.unlock(("orders",))  # ...and released
    other.lock(("orders",), X)
    with pytest.raises(LockTimeout):
        txn.lock(("orders", 2), X, timeout=0)
    with pytest.raises(LockTimeout):
        txn.lock(("orders", 2), X)  # the uncontended path too: it needs IX first
    other.release_all()
    assert txn.lock(("orders", 2), X) is X
    assert txn.held(("orders",)) is IX


def test_requests_kept_from_unlocks_hold_nothing_of_their_past(mgr: LockManager) -> None:
    txn, other = mgr.begin(), mgr.begin()
    txn.lock(("orders",), IX)
    for i in range(3):
        txn.lock(("orders", i), X)
        txn.unlock(("orders", i))
    txn.lock(("orders", 7), S)
    other.lock(("orders",), IS)
    assert other.lock(("orders", 8), S) is S
    with pytest.raises(LockTimeout):
        other.lock(("orders", 7), X, timeout=0)
    assert entries(mgr) == {
        (("orders",), txn.id, IX, True),
        (("orders", 7), txn.id, S, True),
        (("orders",), other.id, IS, True),
        (("orders", 8), other.id, S, True),
    }


def test_an_uncontended_lock_gets_its_time_when_first_seen(mgr: LockManager) -> None:
    txn = mgr.begin()
    txn.lock(("orders",), IX)
    txn.lock(("orders", 1), X)
    before = time.monotonic()
    [since] = [i.since for i in mgr.locks() if i.resource == ("orders", 1)]
    assert before <= since <= time.monotonic()
    assert [i.since for i in mgr.locks() if i.resource == ("orders", 1)] == [since]
