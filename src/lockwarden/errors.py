"""The exceptions lockwarden raises, shared by the in-process manager and the store.

Every error the library raises on purpose is a `LockError`, so one ``except``
clause catches them all. Each subclass also derives from the standard
exception a caller would expect (`LockTimeout` is a `TimeoutError`,
`LockUsageError` a `ValueError`, `NotHeld` a `RuntimeError` like
``threading.Lock().release()`` on an unlocked lock), so generic code that
knows nothing of lockwarden still does the right thing.

Messages are written for the person reading the log: what happened, to which
lock, who is in the way, and what to do next. The same facts are attributes,
for programs, under the same names in both engines: ``name`` is what the
request asked for, ``mode`` its mode, ``timeout`` its limit, ``blockers``
and ``cycle`` who was in the way (docs/contract.md).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "Deadlock",
    "HeldTooLong",
    "Holder",
    "HolderUnresponsive",
    "LockError",
    "LockLost",
    "LockTimeout",
    "LockUsageError",
    "NotHeld",
    "StoreError",
]


class Holder(NamedTuple):
    """Who holds a shared lock, as the store's waiters see it."""

    session_id: str
    app_id: str
    host: str
    pid: int
    held_for: float
    """Seconds since the lock was granted, by the database clock."""
    heartbeat_age: float
    """Seconds since the holder's session last proved it was alive, by the database clock."""

    def __str__(self) -> str:
        return (
            f"app {self.app_id!r} on {self.host} pid {self.pid} "
            f"(held {self.held_for:.1f} s, last heartbeat {self.heartbeat_age:.1f} s ago)"
        )


class LockError(Exception):
    """Base class of every error lockwarden raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword attributes survive pickling (errors cross process boundaries
        # in multi-process programs and tests).
        return (type(self), (str(self),), self.__dict__)


class LockUsageError(LockError, ValueError):
    """The call is wrong: bad input, or an operation the current locks do not allow.

    Raised before anything changes: the locks held are exactly what they were.
    """


class LockTimeout(LockError, TimeoutError):
    """The lock could not be granted in time (a failed try included)."""

    def __init__(
        self,
        message: str,
        *,
        name: object = None,
        mode: object = None,
        timeout: float | None = None,
        blockers: tuple[object, ...] = (),
        resource: object = None,
    ) -> None:
        super().__init__(message)
        self.name = name if resource is None else resource
        """What was asked for: a lock name (a tuple of names for a multi-lock) in the store, a
        resource tuple in the lock manager (``(index name, key)`` for a range lock)."""
        self.mode = mode
        self.timeout = timeout
        """The time limit the request had, in seconds (0: a try)."""
        self.blockers = blockers
        """Who was in the way: owner ids in the local manager, `Holder` records in the store."""

    @property
    def resource(self) -> object:
        """The same as `name` (the keyword and attribute of earlier versions)."""
        return self.name


class Deadlock(LockError):
    """The request would have waited in a cycle; it was refused so the others can go on.

    The locks the owner already held are kept: release them (or retry the
    whole transaction) to let the other side through.
    """

    def __init__(
        self,
        message: str,
        *,
        name: object = None,
        mode: object = None,
        cycle: tuple[object, ...] = (),
        resource: object = None,
    ) -> None:
        super().__init__(message)
        self.name = name if resource is None else resource
        """What the refused request asked for, as in `LockTimeout.name`."""
        self.mode = mode
        self.cycle = cycle
        """The owners in the cycle, the victim first (txn ids locally, session ids in the store)."""

    @property
    def resource(self) -> object:
        """The same as `name` (the keyword and attribute of earlier versions)."""
        return self.name


class NotHeld(LockError, RuntimeError):
    """A release of something this owner does not hold (unknown or already released).

    Raised before anything changes, like `LockUsageError`; a `RuntimeError`
    as for ``threading.Lock().release()`` of an unlocked lock.
    """

    def __init__(self, message: str, *, name: object = None) -> None:
        super().__init__(message)
        self.name = name
        """What the release named, when the engine knows it (as in `LockTimeout.name`)."""


class LockLost(LockError):
    """A lock the caller believed it held is no longer its own.

    Its session expired (a missed heartbeat, by the database clock), another
    waiter reclaimed it, or an administrator broke it. Whatever the caller did
    since may have overlapped with the next holder; fencing tokens let the
    protected resource reject those writes.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        token: int | None = None,
    ) -> None:
        super().__init__(message)
        self.name = name
        self.token = token


class _BlockedByHolder(LockError):
    """A request given up because of who holds the lock: says who, so the reader can act."""

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        holder: Holder | None = None,
    ) -> None:
        super().__init__(message)
        self.name = name
        self.holder = holder


class HolderUnresponsive(_BlockedByHolder):
    """The holder stopped heartbeating and the policy forbids taking the lock over."""


class HeldTooLong(_BlockedByHolder):
    """The holder is alive but has held the lock longer than the store's ``max_hold``."""


class StoreError(LockError):
    """The shared store cannot do its job: unreachable database, bad URL, incompatible schema."""
