"""lockwarden: database-grade locks for Python programs.

In one process, `LockManager` is a lock table like a database engine's:
multi-granularity modes, FIFO queues, upgrades, timeouts and deadlock
detection, for threads and asyncio tasks. Across processes and hosts,
`connect` opens a shared lock store on SQLite, PostgreSQL, MariaDB/MySQL or
an etcd cluster, with leases, heartbeats and fencing tokens.
"""

from typing import TYPE_CHECKING

from lockwarden.errors import (
    Deadlock,
    HeldTooLong,
    Holder,
    HolderUnresponsive,
    LockError,
    LockLost,
    LockTimeout,
    LockUsageError,
    NotHeld,
    StoreError,
)
from lockwarden.modes import Mode

if TYPE_CHECKING:
    from lockwarden.local import LockManager
    from lockwarden.store import connect

__version__ = "0.1.0"

__all__ = [
    "Deadlock",
    "HeldTooLong",
    "Holder",
    "HolderUnresponsive",
    "LockError",
    "LockLost",
    "LockManager",
    "LockTimeout",
    "LockUsageError",
    "Mode",
    "NotHeld",
    "StoreError",
    "__version__",
    "connect",
]


def __getattr__(name: str) -> object:
    """Load the lock manager or the store on first use (PEP 562).

    A program, or `lockwarden run`, that uses one of the two engines does not
    pay the import time of the other.
    """
    if name == "LockManager":
        from lockwarden.local import LockManager  # noqa: PLC0415

        return LockManager
    if name == "connect":
        from lockwarden.store import connect  # noqa: PLC0415

        return connect
    raise AttributeError(f"module 'lockwarden' has no attribute {name!r}")
