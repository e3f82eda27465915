"""An `Observer` that records the store's events as Prometheus metrics in this process.

These are what this program saw (its waits, holds, timeouts); the store-wide
picture, every process's locks, is `lockwarden.observe.metrics.StoreCollector`.
Labels are the mode only: lock names would make a series per name.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from lockwarden.hooks import Observer

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 3600)
"""Seconds, from a free lock's grant to a cron job's hour-long hold."""


class PrometheusObserver(Observer):
    """Histograms of wait and hold times; counters of acquisitions, timeouts, losses, deadlocks.

    ``registry``: where the metrics live (default: prometheus-client's global
    registry, which its HTTP server and exporters serve).
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.wait = Histogram(
            "lockwarden_wait_seconds",
            "Seconds from a lock call to its grant.",
            ["mode"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.hold = Histogram(
            "lockwarden_hold_seconds",
            "Seconds from a grant to its release.",
            ["mode"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.timeouts = Counter(
            "lockwarden_timeouts",
            "Lock calls that gave up (timeouts and busy tries).",
            ["mode"],
            registry=registry,
        )
        self.deadlocks = Counter(
            "lockwarden_deadlocks",
            "Lock calls refused to break a cycle of waits.",
            ["mode"],
            registry=registry,
        )
        self.losses = Counter(
            "lockwarden_lost_locks", "Held locks that were lost.", ["mode"], registry=registry
        )
        self.reclaims = Counter(
            "lockwarden_reclaims",
            "Locks taken over from a dead holder by this process.",
            registry=registry,
        )

    def acquired(self, name: str, mode: str, waited: float) -> None:
        self.wait.labels(mode).observe(waited)

    def released(self, name: str, mode: str, held: float) -> None:
        self.hold.labels(mode).observe(held)

    def timed_out(self, name: str, mode: str, waited: float) -> None:
        self.timeouts.labels(mode).inc()

    def deadlock(self, name: str, mode: str) -> None:
        self.deadlocks.labels(mode).inc()

    def lost(self, name: str, mode: str) -> None:
        self.losses.labels(mode).inc()

    def reclaimed(self, name: str) -> None:
        self.reclaims.inc()
