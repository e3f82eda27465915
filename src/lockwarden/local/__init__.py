"""The in-process lock manager (DESIGN part L): see README.md in this package."""

from lockwarden.local.latch import RWLatch
from lockwarden.local.manager import LockInfo, LockManager, LockStats, Txn

__all__ = ["LockInfo", "LockManager", "LockStats", "RWLatch", "Txn"]
