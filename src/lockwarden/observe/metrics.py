"""The store's state in Prometheus' text format, read fresh at every scrape.

A custom collector rather than gauges set in the background: a scrape sees
the store as it is at that moment, and nothing runs between scrapes. Labels
by name are bounded (``max_names``): the names with the most holders and
waiters get their own series, the rest are summed under ``name="(other)"``,
so a store with 100,000 locks does not make 100,000 series.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lockwarden.modes import Mode
from lockwarden.observe.snapshot import Snapshot

if TYPE_CHECKING:
    from lockwarden.store import Store

OVERRIDES = ("break_lock", "release_all", "reset_fence", "set_permits")
"""The actions of `Store.admin_log`, each always given a series."""

OTHER = "(other)"
"""The name label of the series that sums every name past ``max_names``."""


class StoreCollector(Collector):
    """Collects a snapshot of ``store`` on every scrape (register it with a CollectorRegistry)."""

    def __init__(
        self, store: Store, *, max_names: int = 50, snapshot: Callable[[], Snapshot] | None = None
    ) -> None:
        if max_names < 0:
            raise ValueError(f"max_names must be 0 or more, got {max_names}")
        self._take = snapshot or (lambda: Snapshot.take(store))
        self._max_names = max_names

    def collect(self) -> Iterator[Metric]:
        snap = self._take()
        held = Counter((lock.mode.word, lock.name) for lock in snap.locks if not lock.stale)
        waiting = Counter((w.mode.word, w.name) for w in snap.waiters if not w.stale)
        busiest = Counter[str]()
        for (_, name), n in (held + waiting).items():
            busiest[name] += n
        shown = {name for name, _ in busiest.most_common(self._max_names)}
        yield _by_mode_and_name(
            "lockwarden_locks_held", "Locks held by live sessions.", held, shown
        )
        yield _by_mode_and_name(
            "lockwarden_waiters", "Requests queued by live sessions.", waiting, shown
        )
        sessions = GaugeMetricFamily(
            "lockwarden_sessions", "Sessions the store knows, by state.", labels=["state"]
        )
        live = sum(s.live for s in snap.sessions)
        sessions.add_metric(["live"], live)
        sessions.add_metric(["dead"], len(snap.sessions) - live)
        yield sessions
        yield GaugeMetricFamily(
            "lockwarden_oldest_hold_seconds",
            "How long the longest-held live lock has been held (0: none held).",
            value=max((lock.holder.held_for for lock in snap.locks if not lock.stale), default=0),
        )
        yield GaugeMetricFamily(
            "lockwarden_longest_wait_seconds",
            "How long the longest-waiting live request has waited (0: none waiting).",
            value=max((w.waited_for for w in snap.waiters if not w.stale), default=0),
        )
        yield GaugeMetricFamily(
            "lockwarden_deadlocked_sessions",
            "Sessions on a cycle of waits (the store breaks it at one of their next attempts).",
            value=sum(len(c) for c in snap.cycles),
        )
        overrides = CounterMetricFamily(
            "lockwarden_overrides",
            "Administrators' overrides the store has recorded, by action (break_lock: "
            "locks broken; release_all: other sessions' locks released; set_permits: caps "
            "raised; reset_fence: fences reset).",
            labels=["action"],
        )
        for action in sorted({*OVERRIDES, *snap.overrides}):
            overrides.add_metric([action], snap.overrides.get(action, 0))
        yield overrides
        yield CounterMetricFamily(
            "lockwarden_reclaimed_locks",
            "Locks of dead holders taken over by acquirers, in every process, counted by the "
            "store (lockwarden_reclaims_total of the hooks counts one process's).",
            value=snap.reclaimed,
        )


def _by_mode_and_name(
    metric: str, doc: str, counts: Counter[tuple[str, str]], shown: set[str]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(metric, doc, labels=["mode", "name"])
    series = Counter[tuple[str, str]]()
    for mode in (Mode.S.word, Mode.X.word):
        series[mode, OTHER] += 0  # always present, so an alert on it has a series to watch
    for (mode, name), n in counts.items():
        series[mode, name if name in shown else OTHER] += n
    for (mode, name), n in sorted(series.items()):
        family.add_metric([mode, name], n)
    return family
