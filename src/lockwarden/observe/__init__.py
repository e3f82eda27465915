"""Watching a lock store: snapshots, the waits-for graph, Prometheus metrics.

`Snapshot.take(store)` reads what a store holds in one pass (locks, waiters,
sessions, the waits-for graph and its cycles); the dashboard, `lockwarden
metrics` and `lockwarden status --watch` all show the same snapshot. Only
the store's public, read-only methods are used: watching never changes a lock.
"""

from lockwarden.observe.graph import cycles
from lockwarden.observe.snapshot import Snapshot

__all__ = ["Snapshot", "cycles"]
