"""The common wait queued in the attempt itself (`queries.BLOCKED_BY_LIVE`: PostgreSQL's
`lw_lock`, MySQL's one-round-trip acquire, SQLite's `_QUEUE_BLOCKED`), and what the waiter
reads later (`waiting._look`)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

import pytest

from lockwarden import HeldTooLong, LockLost, LockTimeout, Mode
from lockwarden.store import Session, Store, waiting
from lockwarden.store.backends.base import AcquireRequest, Attempt
from lockwarden.store.backends.mysql.backend import MySQLBackend
from lockwarden.store.backends.postgresql.backend import PostgresBackend
from lockwarden.store.backends.sqlite.backend import SQLiteBackend
from lockwarden.store.wakeups import Subscription
from tests.conftest import stop_heartbeat


@pytest.fixture(params=["sqlite_url", "pg_url", "mysql_url"])
def url(request: pytest.FixtureRequest) -> str:
    """The backends with the shortcut (`store` and `connect` are the shared fixtures)."""
    value: str = request.getfixturevalue(request.param)
    return value


def _attempt(session: Session, name: str, mode: str = "X", request: str | None = None) -> Attempt:
    """One attempt of a request that would wait for ``name``, through the backend.

    Each backend tries the shortcut only for names it has seen fought over (`FoughtOver`,
    tested in `test_sqlite.py`, `test_mysql.py` and `test_postgres.py`; PostgreSQL's
    `lw_lock` tries it for every name it is called for). The name is marked fought over
    here, so that what is tested is the condition itself.
    """
    assert isinstance(session._backend, SQLiteBackend | MySQLBackend | PostgresBackend)
    session._backend._contended.note([name], fought=True)
    request_id = request or secrets.token_hex(16)
    return session._backend.acquire(
        AcquireRequest(session.id, request_id, (name,), (mode,), True, False, None)
    )


def test_a_writer_behind_a_live_holder_queues_without_reading_what_is_in_its_way(
    store: Store,
) -> None:
    """The common wait: the attempt only queues, and what is in the way is read later,
    outside the name's lock that every release of the name waits for (`waiting._look`)."""
    with store.session(app_id="h") as h, store.session(app_id="w") as w:
        held = h.lock("line")
        before = store.stats["statements"]
        attempt = _attempt(w, "line")
        assert (attempt.status, attempt.rows) == ("blocked", None)
        # One round trip; SQLite moves its counter of queue places on in a second statement.
        sent = 2 if isinstance(store._backend, SQLiteBackend) else 1
        assert store.stats["statements"] - before == sent
        assert [x.app_id for x in store.waiters("line")] == ["w"]
        [waiter] = store._backend.query("SELECT seq FROM {p}lw_waiters WHERE name = 'line'", {})
        assert attempt.seq == waiter["seq"]
        held.release()  # the release grants the queued request as any other
        assert [e.holder.app_id for e in store.locks("line")] == ["w"]


def _reader(store: Store, h: Session, w: Session) -> tuple[str, str]:
    h.lock("line")
    return "S", "blocked"


def _holding(store: Store, h: Session, w: Session) -> tuple[str, str]:
    h.lock("line")
    w.lock("elsewhere")  # a waiter holding locks may close a cycle: the check must run
    return "X", "blocked"


def _two_writers(store: Store, h: Session, w: Session) -> tuple[str, str]:
    store.set_permits("line", write=2)
    h.lock("line")
    return "X", "granted"


def _stale_holder(store: Store, h: Session, w: Session) -> tuple[str, str]:
    stale = store.session(app_id="stale", ttl=0.3)
    stale.lock("line", mode="read")
    stop_heartbeat(stale)
    time.sleep(0.5)
    return "X", "granted"  # reclaimed


def _stale_beside_live(store: Store, h: Session, w: Session) -> tuple[str, str]:
    h.lock("line", mode="read")
    _stale_holder(store, h, w)  # reads too: the stale reader is reclaimed, the live one stays
    return "X", "blocked"


def _only_a_waiter(store: Store, h: Session, w: Session) -> tuple[str, str]:
    h.lock("line")
    _attempt(h, "line")  # ... queued behind itself, then the lock is broken: a waiter stays
    store.break_lock("line")
    return "X", "blocked"


def _our_session_stale(store: Store, h: Session, w: Session) -> tuple[str, str]:
    h.lock("line")
    store._backend.query(
        "UPDATE {p}lw_sessions SET expired = TRUE WHERE id = :id", {"id": w.id}, write=True
    )
    return "X", "lost"


@pytest.mark.parametrize(
    "setup",
    [
        _reader,
        _holding,
        _two_writers,
        _stale_holder,
        _stale_beside_live,
        _only_a_waiter,
        _our_session_stale,
    ],
)
def test_every_other_blocked_attempt_is_decided_by_the_full_algorithm(
    store: Store, setup: Callable[[Store, Session, Session], tuple[str, str]]
) -> None:
    """Each condition of `queries.BLOCKED_BY_LIVE` has its case here: without it, the
    request would be queued blind instead of judged, granted or refused."""
    with store.session(app_id="h") as h, store.session(app_id="w") as w:
        mode, status = setup(store, h, w)
        attempt = _attempt(w, "line", mode)
        assert attempt.status == status
        if status == "blocked":
            assert attempt.rows  # read under the name's lock, as always


def test_a_retry_of_a_queued_request_reads_what_is_in_its_way(store: Store) -> None:
    with store.session(app_id="h") as h, store.session(app_id="w") as w:
        h.lock("line")
        request = secrets.token_hex(16)
        assert _attempt(w, "line", request=request).rows is None
        again = _attempt(w, "line", request=request)
        assert again.status == "blocked"
        assert [r["app_id"] for r in again.rows or ()] == ["h"]


def test_a_waiter_queued_without_reading_learns_what_is_in_its_way(
    store: Store, connect: Callable[..., Store]
) -> None:
    with store.session(app_id="h") as h, store.session(app_id="w") as w:
        h.lock("line")
        with pytest.raises(LockTimeout) as caught:
            w.lock("line", timeout=0.6)
        assert [b.app_id for b in caught.value.blockers] == ["h"]
        assert store.waiters("line") == []
        strict = connect(max_hold=0.1)
        with strict.session(app_id="s") as s:
            warm = Subscription(frozenset(), "")  # the first to wait is woken once: not s
            strict._backend.wakeups.add(warm)
            strict._backend.wakeups.remove(warm)
            started = time.monotonic()
            with pytest.raises(HeldTooLong, match="max_hold"):
                s.lock("line", timeout=30)
            assert time.monotonic() - started < waiting.PID_POLL  # judged at once
        assert store.waiters("line") == []


def test_a_holder_gone_stale_meanwhile_is_left_to_an_attempt(store: Store) -> None:
    """Read outside the name's lock, a stale holder is not the waiter's to judge under
    "reclaim": an attempt, which takes the lock, reclaims it. Under "refuse" it is."""
    with store.session(app_id="w") as w:
        stale = store.session(app_id="stale", ttl=0.3)
        stale.lock("line")
        request = secrets.token_hex(16)
        queued = _attempt(w, "line", request=request)
        assert queued.rows is None
        stop_heartbeat(stale)
        time.sleep(0.5)
        want = waiting.Want(
            w.id, request, (("line", Mode.X),), None, False, None, 0.0, LockLost, lambda *_: None
        )
        assert waiting._look(store._backend, want, queued) is None
        refusing = waiting._look(store._backend, want._replace(refuse=True), queued)
        assert refusing is not None
        assert [(r["app_id"], r["live"]) for r in refusing.rows or ()] == [("stale", False)]
