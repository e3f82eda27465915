"""One heartbeat statement per session per interval, whatever the session holds (D2)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from lockwarden.store import Store

TTL = 0.6  # beats every 0.2 s
WINDOW = 1.0


def _statements_while_idle(store: Store, locks: int) -> int:
    """Statements the store sends in a window where a session holding ``locks`` does nothing."""
    with store.session(app_id="hb", ttl=TTL) as s:
        names = [f"hb/{i}" for i in range(locks)]
        for start in range(0, locks, 1000):  # PostgreSQL: keep each transaction's lock count modest
            s.lock_many([(n, "write") for n in names[start : start + 1000]], timeout=30)
        time.sleep(TTL / 3)  # the first beat after the grants
        before = store.stats["statements"]
        time.sleep(WINDOW)
        sent = store.stats["statements"] - before
        [entry] = store.locks(names[-1])  # the beats kept every lock fresh
        assert not entry.stale and entry.holder.heartbeat_age < TTL / 3 + 0.1
        assert len(store.locks()) == locks
        return sent


@pytest.mark.slow
def test_one_statement_per_interval_for_one_lock_or_ten_thousand(
    connect: Callable[..., Store],
) -> None:
    beats = WINDOW / (TTL / 3)
    one = _statements_while_idle(connect(), 1)
    many = _statements_while_idle(connect(), 10_000)
    assert beats - 1 <= one <= beats + 1
    assert beats - 1 <= many <= beats + 1
