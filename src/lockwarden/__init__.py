"""lockwarden: database-grade locks for Python programs.

In one process, `LockManager` is a lock table like a database engine's:
multi-granularity modes, FIFO queues, upgrades, timeouts and deadlock
detection, for threads and asyncio tasks. Across processes and hosts,
`connect` opens a shared lock store on SQLite or PostgreSQL with leases,
heartbeats and fencing tokens.
"""

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
from lockwarden.local import LockManager
from lockwarden.modes import Mode
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
