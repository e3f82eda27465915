"""The error hierarchy: one base, standard-library parents, picklable attributes."""

from __future__ import annotations

import pickle

import pytest

from lockwarden import (
    Deadlock,
    HeldTooLong,
    Holder,
    HolderUnresponsive,
    LockError,
    LockLost,
    LockTimeout,
    LockUsageError,
    Mode,
    NotHeld,
    StoreError,
)


@pytest.mark.parametrize(
    ("cls", "stdlib"),
    [
        (LockUsageError, ValueError),
        (LockTimeout, TimeoutError),
        (NotHeld, RuntimeError),
        (Deadlock, LockError),
        (LockLost, LockError),
        (HolderUnresponsive, LockError),
        (HeldTooLong, LockError),
        (StoreError, LockError),
    ],
)
def test_every_error_is_a_lock_error_and_its_stdlib_parent(cls: type, stdlib: type) -> None:
    assert issubclass(cls, LockError)
    assert issubclass(cls, stdlib)


def test_errors_keep_their_attributes_through_pickle() -> None:
    holder = Holder("s1", "billing", "host-a", 42, held_for=3.0, heartbeat_age=1.5)
    errors = [
        LockTimeout("t", resource=("t", 1), mode=Mode.X, timeout=0.5, blockers=(3, 4)),
        Deadlock("d", resource=("t",), mode=Mode.S, cycle=(1, 2)),
        HolderUnresponsive("h", name="n", holder=holder),
        HeldTooLong("h", name="n", holder=holder),
        LockLost("l", name="n", token=7),
    ]
    for err in errors:
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err)
        assert str(copy) == str(err)
        assert copy.__dict__ == err.__dict__


def test_holder_describes_itself_for_people() -> None:
    holder = Holder("s1", "billing", "host-a", 42, held_for=3.04, heartbeat_age=1.5)
    assert str(holder) == "app 'billing' on host-a pid 42 (held 3.0 s, last heartbeat 1.5 s ago)"
