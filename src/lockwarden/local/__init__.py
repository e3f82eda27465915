"""The in-process lock manager: README.md in this package is its design note."""

from lockwarden.local._range_modes import Kind, RangeMode
from lockwarden.local._ranges import SUPREMUM, Index
from lockwarden.local._settings import DEFAULT
from lockwarden.local._txn import Txn
from lockwarden.local.latch import RWLatch
from lockwarden.local.manager import LockInfo, LockManager, LockStats

__all__ = [
    "DEFAULT",
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
