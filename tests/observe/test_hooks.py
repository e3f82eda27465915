"""Hooks: every kind of event reaches an observer, the debug log and Prometheus."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from lockwarden import hooks
from lockwarden.errors import Deadlock
from lockwarden.observe.prometheus import PrometheusObserver
from lockwarden.store import Session, Store
from tests.conftest import Background, stop_heartbeat, wait_for


class Recorder(hooks.Observer):
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def acquired(self, name: str, mode: str, waited: float) -> None:
        self.events.append(("acquired", name, mode, waited))

    def released(self, name: str, mode: str, held: float) -> None:
        self.events.append(("released", name, mode, held))

    def timed_out(self, name: str, mode: str, waited: float) -> None:
        self.events.append(("timed_out", name, mode, waited))

    def deadlock(self, name: str, mode: str) -> None:
        self.events.append(("deadlock", name, mode))

    def lost(self, name: str, mode: str) -> None:
        self.events.append(("lost", name, mode))

    def reclaimed(self, name: str) -> None:
        self.events.append(("reclaimed", name))

    def kinds(self) -> list[object]:
        return [e[0] for e in self.events]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    stop = hooks.subscribe(rec)
    yield rec
    stop()


def test_a_grant_and_its_release_are_reported_with_wait_and_hold_times(
    store: Store, recorder: Recorder
) -> None:
    s = store.session(app_id="a")
    with s.lock("x", mode="read"):
        pass
    (_, name, mode, waited), (kind, _, _, held) = recorder.events
    assert (name, mode, kind) == ("x", "read", "released")
    assert waited >= 0 and held >= 0


def test_a_timeout_and_a_busy_try_are_reported(store: Store, recorder: Recorder) -> None:
    holder, other = store.session(app_id="h"), store.session(app_id="o")
    holder.lock("busy")
    assert other.try_lock("busy") is None
    with pytest.raises(TimeoutError):
        other.lock("busy", timeout=0.2)
    timeouts = [e for e in recorder.events if e[0] == "timed_out"]
    assert [e[1:3] for e in timeouts] == [("busy", "write"), ("busy", "write")]
    assert timeouts[1][3] >= 0.2


def test_a_deadlock_is_reported(store: Store, recorder: Recorder) -> None:
    a, b = store.session(app_id="a"), store.session(app_id="b")
    a.lock("L1")
    b.lock("L2")
    waiting = Background(lambda: a.lock("L2", timeout=30))
    wait_for(store.waiters)
    with pytest.raises(Deadlock):
        b.lock("L1", timeout=30)
    b.close()
    waiting.result().release()
    assert ("deadlock", "L1", "write") in recorder.events


def test_a_lost_lock_and_its_reclaim_are_reported(store: Store, recorder: Recorder) -> None:
    dying = store.session(app_id="dying", ttl=0.5)
    dying.lock("job")
    stop_heartbeat(dying)
    wait_for(lambda: dying.lost, what="the silent session to lose its lease")
    taker = store.session(app_id="taker")
    wait_for(lambda: taker.try_lock("job") is not None, what="the reclaim")
    assert ("reclaimed", "job") in recorder.events
    assert ("lost", "job", "write") in recorder.events
    assert recorder.kinds().count("lost") == 1


def test_an_observer_that_raises_never_fails_a_lock_call(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(hooks.Observer):
        def acquired(self, name: str, mode: str, waited: float) -> None:
            raise RuntimeError("observer bug")

    stop = hooks.subscribe(Broken())
    try:
        with caplog.at_level(logging.ERROR, "lockwarden.events"):
            store.session(app_id="a").lock("x").release()
    finally:
        stop()
    assert "observer bug" in caplog.text


@pytest.mark.parametrize("many", [False, True], ids=["lock", "lock_many"])
@pytest.mark.parametrize("in_asyncio", [False, True], ids=["threads", "asyncio"])
def test_ctrl_c_between_the_grant_and_the_caller_gives_the_lock_back(
    store: Store, many: bool, in_asyncio: bool
) -> None:
    """Ctrl-C while the grant is being reported (here an observer's KeyboardInterrupt)
    comes after the database granted the lock and before the caller has its stamp:
    the session gives the request back, and the name is free for the next one rather
    than held by a stamp nobody has until the session ends."""

    class Interrupting(hooks.Observer):
        def acquired(self, name: str, mode: str, waited: float) -> None:
            raise KeyboardInterrupt

    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        stop = hooks.subscribe(Interrupting())
        try:
            with pytest.raises(KeyboardInterrupt):
                if in_asyncio:
                    asyncio.run(take_async(a, many))
                elif many:
                    a.lock_many([("x", "write"), ("y", "read")])
                else:
                    a.lock("x")
        finally:
            stop()
        assert a.held == []
        assert store.locks() == []
        b.lock("x", timeout=5).release()


async def take_async(session: Session, many: bool) -> None:
    if many:
        await session.lock_many_async([("x", "write"), ("y", "read")])
    else:
        await session.lock_async("x")


def test_unsubscribed_observers_and_the_debug_log(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()
    hooks.subscribe(rec)()  # subscribed, and stopped at once
    assert not hooks.active()
    with caplog.at_level(logging.DEBUG, "lockwarden.events"):
        assert hooks.active()
        store.session(app_id="a").lock("logged").release()
    assert rec.events == []
    messages = [r.getMessage() for r in caplog.records if r.name == "lockwarden.events"]
    assert messages[0].startswith("acquired 'logged' 'write' ")
    assert messages[1].startswith("released 'logged' 'write' ")
    with pytest.raises(TypeError):
        hooks.subscribe(object())  # type: ignore[arg-type]


def test_the_prometheus_observer_fills_its_histograms_and_counters(store: Store) -> None:
    registry = CollectorRegistry()
    stop = hooks.subscribe(PrometheusObserver(registry))
    try:
        s, other = store.session(app_id="a"), store.session(app_id="b")
        for _ in range(3):
            s.lock("p").release()
        s.lock("p")
        assert other.try_lock("p") is None
    finally:
        stop()
    value = registry.get_sample_value
    assert value("lockwarden_wait_seconds_count", {"mode": "write"}) == 4
    assert value("lockwarden_hold_seconds_count", {"mode": "write"}) == 3
    assert value("lockwarden_timeouts_total", {"mode": "write"}) == 1
