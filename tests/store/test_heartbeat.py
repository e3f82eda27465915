"""One heartbeat statement per session per interval, whatever the session holds."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from lockwarden.store import Store

TTL = 0.6  # beats every 0.2 s
WINDOW = 1.0


def _statements_while_idle(store: Store, locks: int) -> int:
    """Statements the store sends in a window where a session holding ``locks`` does nothing."""
    ttl, window = _timing(store)
    with store.session(app_id="hb", ttl=ttl) as s:
        names = [f"hb/{i}" for i in range(locks)]
        for start in range(0, locks, 1000):  # PostgreSQL: keep each transaction's lock count modest
            s.lock_many([(n, "write") for n in names[start : start + 1000]], timeout=30)
        time.sleep(ttl / 3)  # the first beat after the grants
        before = store.stats["statements"]
        time.sleep(window)
        sent = store.stats["statements"] - before
        [entry] = store.locks(names[-1])  # the beats kept every lock fresh
        assert not entry.stale and entry.holder.heartbeat_age < ttl / 3 + 0.1
        assert len(store.locks()) == locks
        return sent


def _timing(store: Store) -> tuple[float, float]:
    """The TTL and the window: etcd leases count whole seconds, and a multi-lock of a
    thousand names is one large transaction there, slower than a short TTL."""
    return (3.0, 3.0) if store.url.startswith("etcd:") else (TTL, WINDOW)


@pytest.mark.slow
def test_one_statement_per_interval_for_one_lock_or_ten_thousand(
    connect: Callable[..., Store],
) -> None:
    store = connect()
    ttl, window = _timing(store)
    # On etcd a beat is a lease renewal and the linearizable read that confirms it
    # (cluster.Cluster.keep_alive): two requests, however many locks.
    per_beat = 2 if store.url.startswith("etcd:") else 1
    beats = window / (ttl / 3)
    one = _statements_while_idle(store, 1)
    many = _statements_while_idle(connect(), 10_000)
    assert (beats - 1) * per_beat <= one <= (beats + 1) * per_beat
    assert (beats - 1) * per_beat <= many <= (beats + 1) * per_beat
