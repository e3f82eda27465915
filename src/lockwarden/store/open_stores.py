"""The stores this process has open: closed at its exit, taken over by a forked child.

Stores belong to the process that opened them. At interpreter exit every
store still open in this process is closed, which releases its locks at once
(a process killed outright is found out by the next acquirer on the same
machine, `process.gone`). After ``fork()`` the child's first use of a store
opens its own connections and threads (design note, "Processes: exit and
fork")."""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Protocol

from lockwarden import hooks
from lockwarden.store.backends.base import STORE_LOG


class _Open(Protocol):
    """What this registry needs of a store (`store.Store`)."""

    _fork_lock: threading.Lock

    @property
    def url(self) -> str: ...
    @property
    def _inherited(self) -> bool: ...

    def close(self) -> None: ...


STORES: weakref.WeakSet[_Open] = weakref.WeakSet()
"""Every store this process opened and has not closed: closed at exit."""


@atexit.register
def _close_at_exit() -> None:
    """Release at once what a process that ends without `close()` still holds.

    Normal exit, ``sys.exit`` and an uncaught exception all come here; other
    holders then need not wait out the TTL.
    """
    for store in list(STORES):
        if not store._inherited:
            try:
                store.close()
            except Exception as exc:  # the TTL still frees the locks
                hooks.logger(STORE_LOG).warning("closing %s at exit failed: %s", store.url, exc)


def _after_fork_in_child() -> None:
    """In a forked child, before any other code runs: every store gets fresh locks and
    threads, and serves this process from its first use on (`Store._adopt`).

    A parent's thread may have held any of the old locks at the fork, and none
    of the parent's threads (heartbeat, lease timer, listeners) runs here.
    """
    for store in list(STORES):
        store._fork_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
