"""A cycle of waits that lasts, for the observing tests to look at."""

from __future__ import annotations

import secrets
import time

from lockwarden.store import Session, Store
from lockwarden.store.backends.etcd.backend import EtcdBackend
from lockwarden.store.backends.etcd.cluster import put

_QUEUE = """
INSERT INTO {p}lw_waiters (request_id, name, mode, session_id, seq, enqueued_at, expires_at)
VALUES (:request, :name, 'X', :session, :seq, {now}, NULL)
"""


def frozen_cycle(target: Store) -> tuple[Session, Session]:
    """Two live sessions, each holding one lock and queued for the other's.

    The store refuses the request that would close such a cycle (the second
    waiter gets `Deadlock`), so a cycle lives in the tables only for the
    moment between two attempts — or for as long as the processes on it are
    frozen. The test writes the two waiter rows such processes would have
    left, so that the moment lasts until the test is done looking at it.
    """
    a, b = target.session(app_id="cycle-a"), target.session(app_id="cycle-b")
    a.lock("cycle/1")
    b.lock("cycle/2")
    backend = target._backend
    for seq, (session, name) in enumerate(((a, "cycle/2"), (b, "cycle/1")), start=1):
        request = secrets.token_hex(16)
        if isinstance(backend, EtcdBackend):  # the waiter key `_enqueue` would write
            value = {"name": name, "mode": "X", "session": session.id, "at": time.time()}
            value |= {"expires_at": None, "app_id": session.app_id, "host": "test", "pid": 0}
            lease = backend._leases[session.id]
            backend._kv.txn([put(backend._waiter_key(name, request), value, lease=lease)])
        else:
            params = {"request": request, "name": name, "session": session.id}
            backend.query(_QUEUE, params | {"seq": 10**9 + seq}, write=True)
    return a, b
