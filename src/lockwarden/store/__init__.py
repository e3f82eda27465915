"""The shared lock store: locks shared by processes and hosts through SQLite,
PostgreSQL, MariaDB/MySQL or an etcd cluster, with the database as the only
coordinator.

Start with `lockwarden.connect`; the design note (README.md beside this file)
explains the tables, the algorithm and why it is safe.
"""

from lockwarden.store.fence import Fence
from lockwarden.store.opening import check_schema, connect
from lockwarden.store.session import Granted, HeldLock, Session, SharedLock, Stamp
from lockwarden.store.status import Cleaned, LockEntry, Permits, SessionEntry, WaitEdge, WaiterEntry
from lockwarden.store.store import Store

__all__ = [
    "Cleaned",
    "Fence",
    "Granted",
    "HeldLock",
    "LockEntry",
    "Permits",
    "Session",
    "SessionEntry",
    "SharedLock",
    "Stamp",
    "Store",
    "WaitEdge",
    "WaiterEntry",
    "check_schema",
    "connect",
]
