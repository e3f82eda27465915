"""Several processes, killed and frozen holders, clocks that lie (slow; both backends)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lockwarden import LockTimeout
from lockwarden.store import Store
from tests.conftest import Background, Child, lease_slack

pytestmark = pytest.mark.slow

TTL = 1.0


def test_processes_exclude_each_other(
    url: str, tmp_path: Path, children: Callable[..., Child]
) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")
    workers = [children("counter", url, str(counter), "200") for _ in range(4)]
    for worker in workers:
        assert worker.expect(timeout=120) == {"event": "done"}
        assert worker.finish() == 0
    assert counter.read_text() == "800"


def test_killed_holder_is_replaced_within_ttl_and_an_interval(
    store: Store, url: str, children: Callable[..., Child]
) -> None:
    holder = children("holder", url, "job", str(TTL))
    first = holder.expect()
    with store.session(app_id="waiter") as s:
        waiting = Background(lambda: s.lock("job", timeout=10))
        time.sleep(0.3)  # the waiter is queued behind a live holder
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        lock = waiting.result()
        assert time.monotonic() - killed <= TTL + TTL / 3 + lease_slack(store)
        assert lock.token > first["token"]


def test_frozen_holder_is_reclaimed_once_and_learns_it_on_resume(
    store: Store, url: str, children: Callable[..., Child]
) -> None:
    holder = children("holder", url, "job", str(TTL))
    first = holder.expect()
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        a, b = store.session(app_id="a"), store.session(app_id="b")
        got_a = Background(lambda: a.lock("job", timeout=TTL + 1.5))
        got_b = Background(lambda: b.lock("job", timeout=TTL + 1.5))
        outcomes = []
        for waiter in (got_a, got_b):
            try:
                outcomes.append(waiter.result())
            except LockTimeout:
                outcomes.append(None)
        [winner] = [lock for lock in outcomes if lock is not None]  # exactly one reclaimed
        assert winner.token > first["token"]
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    assert "lost" in holder.send("check")
    assert holder.send("on_lost") == {"fired": 1}
    assert "lost" in holder.send("release")  # its release says the lock was lost...
    assert [e.token for e in store.locks("job")] == [winner.token]  # ...and deletes nothing
    winner.check()
    holder.send("exit")


def test_a_frozen_holder_is_reclaimed_when_its_lease_ends_though_the_waiter_asks_meanwhile(
    store: Store, url: str, children: Callable[..., Child]
) -> None:
    """Where a wake-up can be lost, a waiter asks every `Backend.look_every` whether it was
    granted (PostgreSQL); the asking must not put off the look at the holder's lease end."""
    ttl = 3 * (store._backend.look_every or TTL)
    holder = children("holder", url, "frozen-long", str(ttl))
    first = holder.expect()
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        with store.session(app_id="waiter") as s:
            lock = s.lock("frozen-long", timeout=3 * ttl)
            assert time.monotonic() - stopped <= ttl + ttl / 3 + lease_slack(store)
            assert lock.token > first["token"]
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    holder.send("exit")


def test_a_holder_whose_clock_jumps_keeps_its_lock(
    store: Store, url: str, children: Callable[..., Child]
) -> None:
    """Leases run on the store's clock and waits on the monotonic one: a wall clock
    stepped forward by a day, then back by two, changes nothing for its locks."""
    holder = children("holder", url, "stepped", str(TTL), env={"LW_SKEW": "0"})
    token = holder.expect()["token"]
    for step in (86400.0, -2 * 86400.0):
        assert holder.send(f"step {step}")["skew"] != 0
        with store.session(app_id="waiter") as s, pytest.raises(LockTimeout):
            s.lock("stepped", timeout=2 * TTL)  # longer than the TTL: the holder beats on
        assert holder.send("check") == {"held": True}
    assert [e.token for e in store.locks("stepped")] == [token]
    assert holder.send("release") == {"released": True}
    holder.send("exit")
    assert holder.finish() == 0
    assert store.locks("stepped") == []


@pytest.mark.parametrize("skew", [3 * 3600.0, -3 * 3600.0])
def test_a_client_clock_hours_off_changes_nothing(
    store: Store, url: str, children: Callable[..., Child], skew: float
) -> None:
    if url.startswith("etcd:"):
        pytest.skip(
            "etcd has no clock to lend: ages and max_hold compare host clocks there "
            "(src/lockwarden/store/backends/etcd/README.md); liveness is the lease, tested"
            " elsewhere"
        )
    env = {"LW_SKEW": str(skew)}
    # A holder whose clock is off stays live for as long as it beats...
    holder = children("holder", url, "skewed", str(TTL), env=env)
    holder.expect()
    with store.session(app_id="waiter") as s, pytest.raises(LockTimeout):
        s.lock("skewed", timeout=2 * TTL)
    assert holder.send("check") == {"held": True}
    holder.send("exit")
    holder.finish()
    # ...and a waiter whose clock is off does not take a live holder's lock.
    with store.session(app_id="holder", ttl=TTL) as s:
        held = s.lock("skewed")
        waiter = children("waiter", url, "skewed", str(2 * TTL), env=env)
        assert waiter.expect() == {"event": "failed", "error": "LockTimeout"}
        held.check()
