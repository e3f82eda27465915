"""A transactional key-value store on lockwarden's range locks: strict two-phase locking.

    python examples/kvstore.py

Every read takes S next-key locks on what it reads (a point read: the key and
the gap after it; a scan: every key of the range and the gaps between them)
and every write takes X locks; nothing is released before the transaction
ends (strict 2PL). That makes every history of committed transactions
conflict-serializable, range scans included: an insert into a scanned range
waits for the scanner (no phantoms).

The store does what an engine does around the lock manager: a delete only
marks the record, and the key leaves the index when the deleting
transaction commits (purge), handing its locks to the next key; an aborted
insert leaves the same way. A short latch makes each operation atomic on
the data, as a page latch would. With ``history=[]`` the store appends every
operation there in the order it took effect, for a serializability checker.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from lockwarden import Deadlock, LockManager, LockTimeout, Mode
from lockwarden.local import SUPREMUM

T = TypeVar("T")
_GONE = object()
"""The value of a key deleted by a transaction that has not ended yet."""
_ABSENT = object()
"""In an undo entry: the key was not there before (the write inserted it)."""


class KVStore:
    """Keys (mutually comparable) mapped to values, with transactions (`begin`, `run`)."""

    def __init__(
        self, data: dict[Any, Any] | None = None, *, history: list[tuple[Any, ...]] | None = None
    ) -> None:
        self.locks = LockManager(wait_timeout=0.2, max_wait_timeout=None)
        self.index = self.locks.index("kv", table=("kv",), keys=data or ())
        self._data = dict(data or {})
        self._latch = threading.Lock()
        self.history = history

    def begin(self) -> Transaction:
        return Transaction(self)

    def run(self, work: Callable[[Transaction], T], attempts: int = 100) -> T:
        """Run `work` in a transaction and commit; on Deadlock or LockTimeout, abort and retry.

        A retry waits a random while first, longer each time: run at once, it
        takes the same locks again while the transactions it collided with
        still wait, and closes the same cycle again, as the requester and so
        as the victim, until its attempts run out.
        """
        tries = 0
        while True:
            tx = self.begin()
            try:
                result = work(tx)
            except BaseException as exc:
                tx.abort()
                tries += 1
                if not isinstance(exc, Deadlock | LockTimeout) or tries == attempts:
                    raise
                time.sleep(random.uniform(0, 0.001 * 2 ** min(tries, 6)))
                continue
            tx.commit()
            return result

    def snapshot(self) -> dict[Any, Any]:
        """The committed data (call it while no transaction is open)."""
        with self._latch:
            return {k: v for k, v in sorted(self._data.items()) if v is not _GONE}

    def _log(self, tx: Transaction, *op: Any) -> None:
        if self.history is not None:
            self.history.append((tx.id, *op))


class Transaction:
    """One transaction: reads and writes under locks held until `commit` or `abort`."""

    def __init__(self, store: KVStore) -> None:
        self.store = store
        self.locks = store.locks.begin()
        self.id = self.locks.id
        self._undo: list[tuple[Any, Any]] = []
        """(key, value before) for each write, in order."""
        self._deleted: set[Any] = set()

    def get(self, key: Any) -> Any:
        """The value of `key`, or None; nobody may insert or change it until this one ends."""
        self.locks.lock_range(self.store.index, key, key, Mode.S)
        with self.store._latch:
            value = self._value(key)
            self.store._log(self, "read", key, value)
        return value

    def scan(self, lo: Any, hi: Any = SUPREMUM) -> list[tuple[Any, Any]]:
        """The items with ``lo <= key <= hi``, in key order; the range stays as it is."""
        keys = self.locks.lock_range(self.store.index, lo, hi, Mode.S)
        with self.store._latch:
            items = [(k, v) for k in keys if (v := self._value(k)) is not None]
            self.store._log(self, "scan", lo, hi, tuple(items))
        return items

    def put(self, key: Any, value: Any) -> None:
        """Insert `key`, or replace its value."""
        store = self.store
        if not self.locks.lock_range(store.index, key, key, Mode.X):
            self.locks.insert(store.index, key)  # waits for scanners of the gap
            with store._latch:
                store._data[key] = value
                self._undo.append((key, _ABSENT))
                store._log(self, "write", key, value)
            return
        with store._latch:
            self._undo.append((key, store._data[key]))
            store._data[key] = value
            self._deleted.discard(key)
            store._log(self, "write", key, value)

    def delete(self, key: Any) -> bool:
        """Delete `key`; whether it was there. The key leaves the index at commit."""
        store = self.store
        if not self.locks.lock_range(store.index, key, key, Mode.X):
            return False
        with store._latch:
            if store._data[key] is _GONE:  # deleted by this transaction already
                return False
            self._undo.append((key, store._data[key]))
            store._data[key] = _GONE
            self._deleted.add(key)
            store._log(self, "write", key, None)
        return True

    def commit(self) -> None:
        store = self.store
        with store._latch:
            for key in self._deleted:  # purge: the key's locks go to the next key
                del store._data[key]
                store.index.remove(key)
            store._log(self, "commit")
        self.locks.release_all()

    def abort(self) -> None:
        store = self.store
        with store._latch:
            for key, before in reversed(self._undo):
                if before is _ABSENT:  # its own insert: the key leaves, with its locks
                    del store._data[key]
                    store.index.remove(key)
                else:
                    store._data[key] = before
            store._log(self, "abort")
        self.locks.release_all()

    def _value(self, key: Any) -> Any:
        value = self.store._data.get(key)
        return None if value is _GONE else value


def _demo() -> None:
    store = KVStore({10: "a", 20: "b", 30: "c"})
    scanner = store.begin()
    print("scan 10..20:", scanner.scan(10, 20))
    inserter = store.begin()
    try:
        inserter.put(15, "x")  # the scanner holds (.., 20] and the gap after it
    except LockTimeout as err:
        print("insert of 15 waits for the scanner:", err)
        inserter.abort()
    scanner.commit()
    store.run(lambda tx: tx.put(15, "x"))
    print("after:", store.snapshot())


if __name__ == "__main__":
    _demo()
