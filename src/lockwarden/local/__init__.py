"""The in-process lock manager (DESIGN parts L and R): see README.md in this package."""

from lockwarden.local.latch import RWLatch
from lockwarden.local.manager import LockInfo, LockManager, LockStats, Txn
from lockwarden.local.ranges import SUPREMUM, Index, Kind, RangeMode

__all__ = [
    "SUPREMUM",
    "Index",
    "Kind",
    "LockInfo",
    "LockManager",
    "LockStats",
    "RWLatch",
    "RangeMode",
    "Txn",
]
