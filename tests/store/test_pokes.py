"""A release's poke to a granted waiter of its own machine (`inbox`), where another way
covers a poke that is lost: PostgreSQL and MySQL, whose waiters then ask every
`inbox.LOOK_EVERY` whether they were granted. (SQLite's poller covers its lost pokes:
`test_sqlite.py`. Each backend's other way for a poke that cannot be sent is tested in
`test_postgres.py` and `test_mysql.py`.)"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from lockwarden.store import Store, inbox
from tests.conftest import Background, wait_for


@pytest.fixture(params=["pg_url", "mysql_url"])
def url(request: pytest.FixtureRequest) -> str:
    """The backends whose waiters ask (`store` and `connect` are the shared fixtures)."""
    value: str = request.getfixturevalue(request.param)
    return value


def test_a_lost_poke_is_made_up_for_by_the_waiter_looking(
    store: Store, connect: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poke is sent after the release commits: a releaser killed in between never sends
    it, and tells the waiter nothing else. The waiter, granted without knowing, asks
    within `inbox.LOOK_EVERY` whether it was granted, and wakes holding the lock, with no
    attempt."""
    monkeypatch.setattr(store._backend._outbox, "poke", lambda session, request, tokens: True)
    waiter = connect()
    with store.session(app_id="a", ttl=60) as a, waiter.session(app_id="b", ttl=60) as b:
        held = a.lock("lost")
        waiting = Background(lambda: b.lock("lost", timeout=30))
        wait_for(lambda: store.waiters("lost"), what="the waiter to queue")
        time.sleep(0.5)  # past its first look (`waiting.PID_POLL`)
        attempts = waiter.stats["attempts"]
        released = time.monotonic()
        held.release()
        lock = waiting.result(timeout=3 * inbox.LOOK_EVERY)
        assert time.monotonic() - released > 0.1  # not poked
        assert waiter.stats["attempts"] == attempts
        assert [e.token for e in store.locks("lost")] == [lock.token]
