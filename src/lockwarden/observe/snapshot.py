"""One consistent-enough view of a store, as the dashboard, metrics and `status --watch` show it.

Each list is read by one statement, so each is consistent in itself; the
statements are not one transaction, so a lock moving between them can appear
in two lists or none for one refresh. A watcher refreshes every fraction of
a second, and the next snapshot is right: no transaction is held open for
the sake of a display.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lockwarden.modes import Mode
from lockwarden.observe.graph import cycles

if TYPE_CHECKING:
    from lockwarden.store import LockEntry, SessionEntry, Store, WaitEdge, WaiterEntry


@dataclass(frozen=True)
class Snapshot:
    """Locks held, waiters in queue order, sessions, and the waits-for graph with its cycles."""

    locks: list[LockEntry]
    waiters: list[WaiterEntry]
    sessions: list[SessionEntry]
    edges: list[WaitEdge]
    cycles: list[list[str]]
    """Sets of session ids that wait on each other (see `lockwarden.observe.cycles`)."""
    overrides: dict[str, int] = field(default_factory=dict)
    """Administrators' overrides ever recorded, by action (`Store.admin_counts`)."""
    reclaimed: int = 0
    """Locks of dead holders taken over by acquirers, ever (`Store.reclaimed_count`)."""
    taken_at: float = field(default_factory=time.time)
    """When the snapshot was taken, by this host's clock (ages come from the database's)."""

    @classmethod
    def take(cls, store: Store) -> Snapshot:
        """Read the store once: six read-only statements."""
        edges = store.waits_for()
        return cls(
            locks=store.locks(),
            waiters=store.waiters(),
            sessions=store.sessions(),
            edges=edges,
            cycles=cycles((e.waiter, e.blocker) for e in edges),
            overrides=store.admin_counts(),
            reclaimed=store.reclaimed_count(),
        )

    def only(self, prefix: str) -> Snapshot:
        """The part of the snapshot about names starting with ``prefix`` (sessions: all)."""
        if not prefix:
            return self
        edges = [e for e in self.edges if e.name.startswith(prefix)]
        return Snapshot(
            locks=[lock for lock in self.locks if lock.name.startswith(prefix)],
            waiters=[w for w in self.waiters if w.name.startswith(prefix)],
            sessions=self.sessions,
            edges=edges,
            cycles=cycles((e.waiter, e.blocker) for e in edges),
            overrides=self.overrides,
            reclaimed=self.reclaimed,
            taken_at=self.taken_at,
        )

    def to_json(self, limit: int | None = None) -> dict[str, Any]:
        """Plain data for a page: every list cut to ``limit`` rows, with the full counts.

        The graph is never cut: it has one edge per waiting session at most
        per name, and a cycle must be drawn whole.
        """
        on_cycle = {sid for members in self.cycles for sid in members}

        def rows(items: list[Any]) -> list[dict[str, Any]]:
            return [_plain(item) for item in items[:limit]]

        return {
            "taken_at": self.taken_at,
            "counts": {
                "locks": len(self.locks),
                "waiters": len(self.waiters),
                "sessions": len(self.sessions),
                "edges": len(self.edges),
            },
            "locks": rows(self.locks),
            "waiters": rows(self.waiters),
            "sessions": rows(self.sessions),
            "edges": [
                {**e._asdict(), "on_cycle": e.waiter in on_cycle and e.blocker in on_cycle}
                for e in self.edges
            ],
            "cycles": self.cycles,
        }


def _plain(value: Any) -> Any:
    """A record as a dict (a lock's holder within it too); a mode as the store's word
    for it ("read", "write")."""
    if isinstance(value, tuple) and hasattr(value, "_asdict"):  # the store's NamedTuples
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, Mode):
        return value.word
    return value
