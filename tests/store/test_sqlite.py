"""Only on SQLite: wake-ups from other processes, and fairness between this store's writers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from lockwarden.store import Store, queries

from .conftest import Background, Child, wait_for


@pytest.fixture
def url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.mark.slow
def test_a_release_in_another_process_wakes_a_waiter_here(
    store: Store, url: str, children: Callable[..., Child]
) -> None:
    holder = children("holder", url, "xproc", "5")
    holder.expect()
    with store.session(app_id="here") as s:
        waiting = Background(lambda: s.lock("xproc", timeout=10))
        wait_for(lambda: store.waiters("xproc"), what="the waiter to queue")
        time.sleep(0.5)  # long enough for the poll to back off to its slowest
        sent = time.monotonic()
        assert holder.send("release") == {"released": True}
        waiting.result()
        assert time.monotonic() - sent < 0.25  # the poller saw the commit within ~50 ms


def test_a_busy_writer_does_not_starve_a_heartbeat(store: Store) -> None:
    """Back-to-back write transactions in one thread; the heartbeat still gets its turn."""
    quiet = store.session(app_id="quiet", ttl=0.6)
    held = quiet.lock("kept")
    busy = store.session(app_id="busy", ttl=30)
    stop = time.monotonic() + 1.5
    done = threading.Event()

    def hammer() -> None:
        while time.monotonic() < stop:
            busy.lock_many([(f"busy/{i}", "write") for i in range(300)]).release()
        done.set()

    Background(hammer).result(timeout=30)
    assert done.is_set()
    held.check()  # still live: its beats went through between the busy writer's transactions
    assert not quiet.lost


@pytest.mark.parametrize("statement", ["ACQUIRE_STATE", "GRANTED", "CHECK", "RELEASE"])
def test_a_request_is_found_through_its_own_index(store: Store, statement: str) -> None:
    """Not through lw_holders_session: that walked every lock the session holds, so acquire
    and release slowed with each lock a session took (found by bench/store.py)."""
    params = {"session": "s", "request": "r", "names": ["a"], "modes": ["X"]}
    plan = store._backend.query("EXPLAIN QUERY PLAN " + getattr(queries, statement), params)
    details = " / ".join(row["detail"] for row in plan)
    assert "lw_holders_request" in details
    assert "lw_holders_session" not in details
