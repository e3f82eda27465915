"""The contract of docs/contract.md: the same cases, run against the lock manager and the store.

Each engine is driven through a small adapter (`Engine`) that says how an
owner is opened, how a lock is taken and released and what the engine calls
the thing locked; every test below is written once against that adapter and
runs on the in-process manager, the SQLite store and the PostgreSQL store
(a fresh schema per test, as in tests/store/).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

import pytest

import lockwarden
from lockwarden import (
    Deadlock,
    LockError,
    LockManager,
    LockTimeout,
    LockUsageError,
    Mode,
    NotHeld,
)
from lockwarden.local import DEFAULT
from lockwarden.store import Store
from tests.conftest import pg_schema, pg_url, sqlite_url  # noqa: F401  (fixtures)

OMITTED: Any = DEFAULT
"""Stands for "no timeout argument" in `Engine.lock`."""


class Engine:
    """How the contract's cases drive one engine."""

    default_timeout: float | None
    """What an omitted timeout means: seconds, or None for no limit."""

    def owner(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def lock(self, owner: Any, name: str, mode: Mode, timeout: Any = OMITTED) -> Any:
        """Take `name`; returns the handle `release` takes."""
        raise NotImplementedError

    def release(self, owner: Any, handle: Any) -> None:
        raise NotImplementedError

    def held(self) -> set[str]:
        """The names someone holds."""
        raise NotImplementedError

    def waiting(self) -> int:
        """How many requests wait."""
        raise NotImplementedError

    def key(self, name: str) -> object:
        """What the engine's errors carry as ``name`` for `name`."""
        raise NotImplementedError


class Manager(Engine):
    default_timeout = 0.3

    def __init__(self) -> None:
        self.mgr = LockManager(("lock",), wait_timeout=self.default_timeout, max_wait_timeout=None)

    def owner(self) -> AbstractContextManager[Any]:
        return self.mgr.begin()

    def lock(self, owner: Any, name: str, mode: Mode, timeout: Any = OMITTED) -> Any:
        owner.lock((name,), mode, timeout=timeout)
        return (name,)

    def release(self, owner: Any, handle: Any) -> None:
        owner.unlock(handle)

    def held(self) -> set[str]:
        return {str(info.resource[0]) for info in self.mgr.locks() if info.granted}

    def waiting(self) -> int:
        return len(self.mgr.waits_for())

    def key(self, name: str) -> object:
        return (name,)


class SharedStore(Engine):
    default_timeout = None

    def __init__(self, store: Store) -> None:
        self.store = store

    def owner(self) -> AbstractContextManager[Any]:
        return self.store.session(app_id="contract")

    def lock(self, owner: Any, name: str, mode: Mode, timeout: Any = OMITTED) -> Any:
        if timeout is OMITTED:
            return owner.lock(name, mode)
        return owner.lock(name, mode, timeout=timeout)

    def release(self, owner: Any, handle: Any) -> None:
        handle.release()

    def held(self) -> set[str]:
        return {entry.name for entry in self.store.locks()}

    def waiting(self) -> int:
        return len(self.store.waiters())

    def key(self, name: str) -> object:
        return name


@pytest.fixture(params=["manager", "sqlite", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    if request.param == "manager":
        yield Manager()
        return
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    store = lockwarden.connect(url)
    try:
        yield SharedStore(store)
    finally:
        store.close()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def until(predicate: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def queue_behind(engine: Engine, pool: ThreadPoolExecutor, call: Callable[[], Any]) -> Future[Any]:
    """Run `call` in a thread and return once it waits in a queue."""
    before = engine.waiting()
    future = pool.submit(call)
    until(lambda: engine.waiting() > before or future.done(), "the call queues")
    assert not future.done(), future.exception()
    return future


# -- timeout -------------------------------------------------------------------------------


def test_timeout_zero_tries_once(engine: Engine) -> None:
    with engine.owner() as a, engine.owner() as b:
        engine.lock(a, "x", Mode.X, timeout=0)
        started = time.monotonic()
        with pytest.raises(LockTimeout) as err:
            engine.lock(b, "x", Mode.X, timeout=0)
        assert time.monotonic() - started < 5
        assert engine.waiting() == 0  # nothing was queued
        assert (err.value.name, err.value.mode, err.value.timeout) == (engine.key("x"), Mode.X, 0)
        assert len(err.value.blockers) == 1
        assert engine.held() == {"x"}


def test_a_positive_timeout_waits_that_long(engine: Engine) -> None:
    with engine.owner() as a, engine.owner() as b:
        engine.lock(a, "x", Mode.X)
        started = time.monotonic()
        with pytest.raises(LockTimeout) as err:
            engine.lock(b, "x", Mode.S, timeout=0.2)
        assert time.monotonic() - started >= 0.2
        assert (err.value.name, err.value.mode, err.value.timeout) == (engine.key("x"), Mode.S, 0.2)
        assert engine.waiting() == 0  # the request left the queue


def test_none_waits_without_limit(engine: Engine, pool: ThreadPoolExecutor) -> None:
    with engine.owner() as a, engine.owner() as b:
        handle = engine.lock(a, "x", Mode.X)
        waiter = queue_behind(engine, pool, lambda: engine.lock(b, "x", Mode.X, timeout=None))
        time.sleep(0.5)  # longer than the manager's default here
        assert not waiter.done()
        engine.release(a, handle)
        waiter.result(timeout=10)
        assert engine.held() == {"x"}


def test_an_omitted_timeout_is_the_configured_default(
    engine: Engine, pool: ThreadPoolExecutor
) -> None:
    with engine.owner() as a, engine.owner() as b:
        handle = engine.lock(a, "x", Mode.X)
        if engine.default_timeout is None:
            waiter = queue_behind(engine, pool, lambda: engine.lock(b, "x", Mode.X))
            time.sleep(0.5)
            assert not waiter.done()
            engine.release(a, handle)
            waiter.result(timeout=10)
        else:
            with pytest.raises(LockTimeout) as err:
                engine.lock(b, "x", Mode.X)
            assert err.value.timeout == engine.default_timeout


@pytest.mark.parametrize("timeout", [-1, -0.5, math.nan, math.inf, True, "1"])
def test_a_bad_timeout_is_a_usage_error_before_anything_changes(
    engine: Engine, timeout: object
) -> None:
    with engine.owner() as a:
        engine.lock(a, "held", Mode.X)
        with pytest.raises(LockUsageError) as err:
            engine.lock(a, "x", Mode.X, timeout=timeout)
        assert isinstance(err.value, ValueError)
        assert engine.held() == {"held"}


# -- errors ----------------------------------------------------------------------------


def test_a_wait_that_closes_a_cycle_is_refused_with_deadlock(
    engine: Engine, pool: ThreadPoolExecutor
) -> None:
    with engine.owner() as a, engine.owner() as b:
        engine.lock(a, "x", Mode.X)
        b_holds = engine.lock(b, "y", Mode.X)
        a_waits = queue_behind(engine, pool, lambda: engine.lock(a, "y", Mode.X, timeout=30))
        with pytest.raises(Deadlock) as err:
            engine.lock(b, "x", Mode.X, timeout=30)
        assert isinstance(err.value, LockError)
        assert (err.value.name, err.value.mode) == (engine.key("x"), Mode.X)
        assert len(err.value.cycle) == 2
        assert engine.held() == {"x", "y"}  # the refused owner keeps what it held
        engine.release(b, b_holds)
        a_waits.result(timeout=10)


def test_releasing_what_is_not_held_raises_not_held(engine: Engine) -> None:
    with engine.owner() as a:
        handle = engine.lock(a, "x", Mode.X)
        engine.release(a, handle)
        with pytest.raises(NotHeld) as err:
            engine.release(a, handle)
        assert isinstance(err.value, RuntimeError)
        assert err.value.name in (None, engine.key("x"))
        assert engine.held() == set()


# -- context managers --------------------------------------------------------------------


def test_an_owner_as_a_context_manager_releases_everything(engine: Engine) -> None:
    with engine.owner() as a:
        engine.lock(a, "x", Mode.X)
        engine.lock(a, "y", Mode.S)
        assert engine.held() == {"x", "y"}
    assert engine.held() == set()


def test_an_owner_releases_everything_when_its_block_raises(engine: Engine) -> None:
    with pytest.raises(KeyError), engine.owner() as a:
        engine.lock(a, "x", Mode.X)
        raise KeyError("the work failed")
    assert engine.held() == set()
