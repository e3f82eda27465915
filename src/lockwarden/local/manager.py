"""`LockManager`: the public face of the lock table, with its settings and introspection.

The rules live in the modules below it (README.md in this package says which
file holds which); this one makes a manager from its settings, hands out
transactions and indexes, and reads the table for `locks`, `waits_for` and
`stats`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from lockwarden.errors import LockUsageError
from lockwarden.local._deadlock import Victim
from lockwarden.local._queue import Queue, Request
from lockwarden.local._range_modes import RangeMode
from lockwarden.local._ranges import Index
from lockwarden.local._settings import Settings
from lockwarden.local._table import LockTable
from lockwarden.local._txn import Resource, Txn, _check_resource
from lockwarden.modes import Mode

__all__ = ["LockInfo", "LockManager", "LockStats"]


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One entry of `LockManager.locks()`: a granted lock or a waiting request."""

    resource: Resource
    """For a range lock, ``(index name, key)``."""
    owner: int
    """The owning transaction's id."""
    mode: Mode | RangeMode
    granted: bool
    since: float
    """``time.monotonic()`` when it was granted, or when it started waiting. A row lock granted
    on the uncontended path reads no clock: its time is that of the first `locks()` call (or
    the first request of another owner) that saw it."""
    kind: str = "data"
    """"data" for resource locks, "metadata" for a table's metadata lock, "range" for a key."""


@dataclass(frozen=True, slots=True)
class LockStats:
    """Counters since the manager was created."""

    grants: int
    waits: int
    """Requests that could not be granted at once and queued (failed tries excluded)."""
    timeouts: int
    deadlocks: int
    escalations: int
    wait_time: float
    """Total seconds spent queued, however the waits ended."""


class LockManager(LockTable):
    """A lock table with intention modes, FIFO queues, upgrades, timeouts and deadlock detection.

    Resources are tuples naming a path in a hierarchy whose levels are
    `levels` (by default a table and its rows: ``("orders",)`` and
    ``("orders", 42)``). Locks are held by transactions from `begin`.

    Timeouts (seconds) come in two classes, as in the AntDB-M engine: row and
    intention locks wait `wait_timeout` by default and at most
    `max_wait_timeout`; locks that cover a whole table or more (S, SIX, X above
    the last level) and exclusive metadata locks wait `ddl_wait_timeout`, at
    most `max_ddl_wait_timeout`. A default of None waits up to the maximum; a
    maximum of None means unbounded. A call's own ``timeout`` follows
    docs/contract.md.

    Settings are read-only after construction: make another manager to
    change them.
    """

    __slots__ = ("_indexes",)

    def __init__(
        self,
        levels: tuple[str, ...] = ("table", "row"),
        *,
        strict: bool = False,
        wait_timeout: float | None = 0.05,
        max_wait_timeout: float | None = 0.6,
        ddl_wait_timeout: float | None = 1.8,
        max_ddl_wait_timeout: float | None = 7.2,
        victim: Victim = "requester",
        deadlock_max_steps: int = 1_000_000,
        deadlock_max_depth: int = 200,
        escalation_threshold: int | None = 5000,
        escalation_retry: int = 1250,
        metadata_locks: bool = False,
        metadata_exclusive_streak: int = 4,
    ) -> None:
        super().__init__(
            Settings(
                levels=levels,
                strict=strict,
                wait_timeout=wait_timeout,
                max_wait_timeout=max_wait_timeout,
                ddl_wait_timeout=ddl_wait_timeout,
                max_ddl_wait_timeout=max_ddl_wait_timeout,
                victim=victim,
                deadlock_max_steps=deadlock_max_steps,
                deadlock_max_depth=deadlock_max_depth,
                escalation_threshold=escalation_threshold,
                escalation_retry=escalation_retry,
                metadata_locks=metadata_locks,
                metadata_exclusive_streak=metadata_exclusive_streak,
            )
        )
        self._indexes: dict[str, Index] = {}

    # -- settings, read-only -----------------------------------------------------------

    @property
    def levels(self) -> tuple[str, ...]:
        """The names of the levels of the hierarchy, root first; a resource has 1 to len parts."""
        return self._settings.levels

    @property
    def strict(self) -> bool:
        """Whether a call must find its ancestors' intention locks taken, instead of taking them."""
        return self._settings.strict

    @property
    def wait_timeout(self) -> float | None:
        """Default time limit of row and intention locks, in seconds."""
        return self._settings.wait_timeout

    @property
    def max_wait_timeout(self) -> float | None:
        """Longest time limit a row or intention lock may ask for (None: unbounded)."""
        return self._settings.max_wait_timeout

    @property
    def ddl_wait_timeout(self) -> float | None:
        """Default time limit of table (or coarser) locks and exclusive metadata locks."""
        return self._settings.ddl_wait_timeout

    @property
    def max_ddl_wait_timeout(self) -> float | None:
        """Longest time limit of table (or coarser) locks and exclusive metadata locks."""
        return self._settings.max_ddl_wait_timeout

    @property
    def victim(self) -> Victim:
        """Whose request a deadlock refuses: "requester", "youngest" or "fewest_locks"."""
        return self._settings.victim

    @property
    def deadlock_max_steps(self) -> int:
        """Edges a deadlock search may follow before it counts as a deadlock of the requester."""
        return self._settings.deadlock_max_steps

    @property
    def deadlock_max_depth(self) -> int:
        """Longest path a deadlock search may follow before it counts as a deadlock."""
        return self._settings.deadlock_max_depth

    @property
    def escalation_threshold(self) -> int | None:
        """Row locks under one parent above which escalation is tried (None: never)."""
        return self._settings.escalation_threshold

    @property
    def escalation_retry(self) -> int:
        """Rows more after which a failed escalation is tried again."""
        return self._settings.escalation_retry

    @property
    def metadata_locks(self) -> bool:
        """Whether tables have metadata locks."""
        return self._settings.metadata_locks

    @property
    def metadata_exclusive_streak(self) -> int:
        """Exclusive metadata grants in a row, while shared requests wait, before those go first."""
        return self._settings.metadata_exclusive_streak

    # -- owners and indexes --------------------------------------------------------------

    def begin(self, name: str | None = None) -> Txn:
        """A new owner of locks. Ids grow in `begin` order, so the youngest has the highest."""
        return Txn(self, self._next_id(), name)

    def index(self, name: str, *, table: Resource | None = None, keys: Iterable[Any] = ()) -> Index:
        """The ordered index called `name`, made on first use with `table` and `keys`.

        Range locks on its keys first take the intention lock they need on
        `table` (IS to read, IX to write or insert), like a row lock on its
        table; without a table they stand alone. Later calls return the same
        index and may not pass a different table or any keys.
        """
        if not isinstance(name, str) or not name:
            raise LockUsageError(f"an index name is a non-empty string, got {name!r}")
        if table is not None:
            _check_resource(self, table, Mode.IX)
        with self._mutex:
            index = self._indexes.get(name)
            if index is None:
                index = self._indexes[name] = Index(self, name, table, keys)
            elif (table is not None and table != index.table) or keys != ():
                raise LockUsageError(
                    f"index {name!r} exists (table {index.table!r}); call mgr.index({name!r}) "
                    f"without a table or keys to get it, or choose another name"
                )
            return index

    # -- introspection -------------------------------------------------------------------

    def locks(self) -> list[LockInfo]:
        """A consistent snapshot of every granted lock and waiting request."""
        out: list[LockInfo] = []
        with self._mutex:
            now = time.monotonic()
            for key, entry in self._all_entries():
                if isinstance(entry, Request):  # a solo lock
                    assert entry.mode is not None
                    out.append(LockInfo(key, entry.owner.id, entry.mode, True, _since(entry, now)))
                    continue
                resource = entry.resource
                resource = resource if type(resource) is tuple else (resource,)
                kind = entry.table.value
                for req in entry.granted.values():
                    assert req.mode is not None
                    out.append(
                        LockInfo(resource, req.owner.id, req.mode, True, _since(req, now), kind)
                    )
                for req in entry.waiting:  # an upgrade is listed again here, as waiting
                    assert req.wanted is not None
                    out.append(
                        LockInfo(resource, req.owner.id, req.wanted, False, _since(req, now), kind)
                    )
        return out

    def waits_for(self) -> dict[int, set[int]]:
        """The waits-for graph: each waiting transaction's id → the ids it waits for."""
        graph: dict[int, set[int]] = {}
        with self._mutex:
            for _, entry in self._all_entries():
                if isinstance(entry, Queue):
                    for req in entry.waiting:
                        graph[req.owner.id] = {b.owner.id for b in entry.blockers(req)}
        return graph

    def _all_entries(self) -> Iterator[tuple[Any, Queue[Any] | Request[Mode]]]:
        yield from self._meta_queues.items()
        yield from self._queues.items()
        yield from self._range_queues.items()

    def stats(self) -> LockStats:
        with self._mutex:
            return LockStats(
                self._grants,
                self._waits,
                self._timeouts,
                self._deadlocks,
                self._escalations,
                self._wait_time,
            )


def _since(req: Request[Any], now: float) -> float:
    """When `req` was granted or started to wait; a lock granted uncontended is stamped `now`."""
    if req.since is None:
        req.since = now
    return req.since
