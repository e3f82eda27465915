"""What a watcher reads: sessions, the waits-for graph, snapshots and /metrics, on both backends."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lockwarden.observe import Snapshot
from lockwarden.observe.metrics import OTHER, OVERRIDES, StoreCollector
from lockwarden.store import Store
from tests.conftest import Background, Child, stop_heartbeat, wait_for
from tests.observe.conftest import frozen_cycle


def test_sessions_lists_live_and_dead_sessions_with_their_ttl(
    connect: Callable[..., Store],
) -> None:
    store = connect()
    live = store.session(app_id="live", ttl=30)
    dying = store.session(app_id="dying", ttl=0.3)
    stop_heartbeat(dying)
    # A dead session is listed as such until `clean` (on etcd it goes with its lease).
    wait_for(lambda: all(not s.live for s in store.sessions() if s.app_id == "dying"))
    by_app = {s.app_id: s for s in store.sessions()}
    assert by_app["live"].live and by_app["live"].ttl == 30
    assert by_app["live"].session_id == live.id
    if "dying" in by_app:
        assert by_app["dying"].heartbeat_age >= 0.3
        assert by_app["dying"].session_id == dying.id


def test_waits_for_names_who_waits_for_whom_and_on_what(store: Store) -> None:
    holder, waiter = store.session(app_id="h"), store.session(app_id="w")
    holder.lock("res")
    queued = Background(lambda: waiter.lock("res", timeout=10))
    wait_for(store.waits_for, what="the waiter's edge")
    edges = store.waits_for()
    assert [(e.waiter, e.blocker, e.name) for e in edges] == [(waiter.id, holder.id, "res")]
    assert Snapshot.take(store).cycles == []
    holder.close()
    queued.result().release()
    assert store.waits_for() == []


def test_a_cycle_of_waits_is_found_and_marked(store: Store) -> None:
    a, b = frozen_cycle(store)
    snap = Snapshot.take(store)
    assert snap.cycles == [sorted([a.id, b.id])]
    data = snap.to_json()
    assert all(edge["on_cycle"] for edge in data["edges"])
    assert data["counts"] == {"locks": 2, "waiters": 2, "sessions": 2, "edges": 2}


def test_the_snapshot_filters_by_name_prefix_and_cuts_rows_but_not_counts(store: Store) -> None:
    s = store.session(app_id="app")
    for i in range(5):
        s.lock(f"jobs/{i}")
    s.lock("other", mode="read")
    snap = Snapshot.take(store)
    jobs = snap.only("jobs/")
    assert sorted(lock.name for lock in jobs.locks) == [f"jobs/{i}" for i in range(5)]
    data = jobs.to_json(limit=2)
    assert data["counts"]["locks"] == 5 and len(data["locks"]) == 2
    assert {lock["mode"] for lock in snap.to_json()["locks"]} == {"read", "write"}


def scrape(store: Store, max_names: int = 50) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, max_names=max_names))
    text = generate_latest(registry).decode()
    return {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in text_string_to_metric_families(text)
    }


def test_metrics_count_holders_waiters_sessions_and_ages(store: Store) -> None:
    holder, waiter = store.session(app_id="h"), store.session(app_id="w")
    holder.lock("a")
    holder.lock("b", mode="read")
    queued = Background(lambda: waiter.lock("a", timeout=10))
    wait_for(store.waiters)
    m = scrape(store)
    held = {(lb["mode"], lb["name"]): v for lb, v in m["lockwarden_locks_held"]}
    assert held[("write", "a")] == 1 and held[("read", "b")] == 1
    assert held[("write", OTHER)] == 0
    waiting = {(lb["mode"], lb["name"]): v for lb, v in m["lockwarden_waiters"]}
    assert waiting[("write", "a")] == 1
    assert {lb["state"]: v for lb, v in m["lockwarden_sessions"]} == {"live": 2, "dead": 0}
    assert m["lockwarden_oldest_hold_seconds"][0][1] > 0
    assert m["lockwarden_longest_wait_seconds"][0][1] > 0
    assert m["lockwarden_deadlocked_sessions"][0][1] == 0
    holder.close()
    queued.result().release()


def test_metrics_keep_to_the_name_cardinality_limit(store: Store) -> None:
    s = store.session(app_id="many")
    for i in range(30):
        s.lock(f"n{i}")
    m = scrape(store, max_names=10)
    names = {lb["name"] for lb, _ in m["lockwarden_locks_held"]}
    assert len(names - {OTHER}) == 10
    total = sum(v for lb, v in m["lockwarden_locks_held"] if lb["mode"] == "write")
    assert total == 30  # nothing lost: the rest is summed under OTHER


def test_metrics_show_sessions_on_a_cycle(store: Store) -> None:
    frozen_cycle(store)
    assert scrape(store)["lockwarden_deadlocked_sessions"][0][1] == 2


def test_metrics_count_the_overrides_the_store_recorded(store: Store) -> None:
    before = {lb["action"]: v for lb, v in scrape(store)["lockwarden_overrides"]}
    assert before == dict.fromkeys(OVERRIDES, 0)  # every action has a series from the start
    s = store.session(app_id="victim")
    s.lock("broken")
    store.break_lock("broken")
    s.lock("other")
    store.break_lock("other")
    store.reset_fence("fenced")
    after = {lb["action"]: v for lb, v in scrape(store)["lockwarden_overrides"]}
    assert after == {**before, "break_lock": 2, "reset_fence": 1}
    assert store.admin_counts() == {"break_lock": 2, "reset_fence": 1}
    s.close()


def test_metrics_count_the_locks_reclaimed_in_every_process(
    connect: Callable[..., Store], url: str, children: Callable[..., Child]
) -> None:
    """A lock taken over from a killed process shows in any process's scrape, under a name
    apart from the hooks' ``lockwarden_reclaims_total`` (what one process saw)."""
    store = connect()
    assert scrape(store)["lockwarden_reclaimed_locks"] == [({}, 0.0)]
    holder = children("holder", url, "job", "1.0")
    holder.expect()
    os.kill(holder.pid, signal.SIGKILL)
    with store.session(app_id="taker") as taker:
        taker.lock("job", timeout=10).release()
    watcher = connect()  # another store, as a dashboard's would be
    m = scrape(watcher)
    assert m["lockwarden_reclaimed_locks"] == [({}, 1.0)]
    assert "lockwarden_reclaims" not in m
    assert Snapshot.take(watcher).only("nothing/").reclaimed == 1
