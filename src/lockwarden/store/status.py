"""What the store reports about itself: locks, waiters, permits, clean-up counts.

Ages are seconds by the database clock; "stale" means the holder's session
is no longer live (design note, "The liveness predicate").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from lockwarden.errors import Holder
from lockwarden.modes import Mode


def holder_of(row: Mapping[str, Any]) -> Holder:
    """The holder described by a row with session columns, ``since`` and the database's ``now``."""
    return Holder(
        session_id=row["session_id"],
        app_id=row["app_id"],
        host=row["host"],
        pid=row["pid"],
        held_for=row["now"] - row["since"],
        heartbeat_age=row["now"] - row["heartbeat_at"],
    )


class LockEntry(NamedTuple):
    """One granted lock (a read lock has one entry per reader)."""

    name: str
    mode: Mode
    """`Mode.S` or `Mode.X`, shown (``str``, ``print``) as ``status --json`` writes it:
    "read" or "write"."""
    token: int
    holder: Holder
    """Session, app, host, pid, how long held, heartbeat age."""
    stale: bool
    """The holder's session is not live: the next waiter will reclaim it (or, under
    the "refuse" policy, report it)."""


class WaiterEntry(NamedTuple):
    """One queued request for one name, in queue order within the name."""

    name: str
    mode: Mode
    """As `LockEntry.mode`: shown "read" or "write"."""
    session_id: str
    app_id: str
    host: str
    pid: int
    waited_for: float
    expires_in: float | None
    """Seconds until the waiter gives up (None: it waits without limit)."""
    stale: bool
    """The waiter's session is not live, or its deadline passed: it no longer counts."""


class SessionEntry(NamedTuple):
    """One session: a participant in the store, kept alive by its heartbeat."""

    session_id: str
    app_id: str
    host: str
    pid: int
    ttl: float
    """Seconds the session survives without a heartbeat."""
    age: float
    """Seconds since the session was opened, by the database clock."""
    heartbeat_age: float
    """Seconds since its last heartbeat, by the database clock."""
    live: bool
    """Not expired and its heartbeat younger than its TTL: its locks count."""


class WaitEdge(NamedTuple):
    """Session ``waiter`` waits on ``name`` for session ``blocker`` (holder or waiter ahead)."""

    waiter: str
    blocker: str
    name: str


class Permits(NamedTuple):
    """How many holders each mode of a name admits at once."""

    read: int | None
    """None: readers are not limited."""
    write: int


class _Removed(NamedTuple):
    sessions: int
    locks: int
    waiters: int


class Cleaned(_Removed):
    """What `Store.clean` removed: ``sessions``, the expired sessions; ``locks``, the locks
    they still had; ``waiters``, the waiting requests whose session is gone or whose time
    ran out. The words of ``lockwarden clean --json``.

    ``holders`` is the old name of ``locks``: it still reads, and still builds one
    (``Cleaned(sessions=1, holders=2, waiters=0)``).
    """

    __slots__ = ()

    def __new__(
        cls,
        sessions: int,
        locks: int | None = None,
        waiters: int | None = None,
        *,
        holders: int | None = None,
    ) -> Cleaned:
        removed = holders if locks is None else locks
        if removed is None or (locks is not None and holders is not None) or waiters is None:
            raise TypeError("Cleaned takes sessions, locks (or holders, its old name) and waiters")
        return super().__new__(cls, sessions, removed, waiters)

    @property
    def holders(self) -> int:
        """The old name of ``locks``."""
        return self.locks


class AdminAction(NamedTuple):
    """One administrator's override, as `Store.admin_log` returns it."""

    action: str
    """"release_all", "set_permits", "break_lock" or "reset_fence"."""
    subject: str
    """The app id, lock name or fence resource acted on."""
    detail: str
    host: str
    pid: int
    age: float
    """Seconds ago, by the database clock."""
