"""The worker's look for names a refused multi-lock left held waits for the session's
releases retried in the background, and says how many were still pending; told of a
loss, it stops at once; its deadline is its lease's end, and the control run has none."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockwarden
from chaos.history import HistoryWriter, load_history
from chaos.worker import Client, StallDumps, Stop, Told, _never, _settled, lease_end
from lockwarden import LockLost
from lockwarden.store import Session, lease
from tests.conftest import resume_heartbeat, stop_heartbeat


@pytest.fixture
def session(sqlite_url: str) -> Iterator[Session]:
    store = lockwarden.connect(sqlite_url)
    yield store.session(app_id="worker", ttl=2.0)
    store.close()


def test_the_look_waits_until_a_clean_up_retried_in_the_background_is_confirmed(
    session: Session,
) -> None:
    held = session.lock("n0")
    stop_heartbeat(session)  # the thread that retries releases: held back for now
    session._retry_release(held.id, ["n0"])  # as after a clean-up that met an outage
    assert session.releasing == 1
    resume_heartbeat(session)
    assert _settled(session, 2.0) == 0
    assert session.releasing == 0 and session._store.locks("n0") == []


def test_a_retry_still_pending_after_a_ttl_is_reported(session: Session) -> None:
    held = session.lock("n0")
    stop_heartbeat(session)
    session._retry_release(held.id, ["n0"])
    started = time.monotonic()
    assert _settled(session, 0.3) == 1
    assert time.monotonic() - started >= 0.3
    resume_heartbeat(session)


def test_stall_dumps_write_the_stacks_of_an_acquire_that_overruns_only(tmp_path: Path) -> None:
    """`--dump-stalls`: a block still running after its seconds leaves every thread's stack,
    this test's call among them, after the line naming its process; one that ends in time
    leaves the line alone."""
    history = tmp_path / "h.jsonl"
    dumps = StallDumps(str(history), 3)
    with dumps.watching("3.0.1", 5.0):
        pass
    with dumps.watching("3.0.2", 0.05):
        time.sleep(0.5)
    (written,) = (tmp_path / "h.jsonl.stalls").iterdir()
    assert written.name.startswith("3-")
    text = written.read_text()
    first, second = text.split("== ")[1:]
    assert first.startswith("3.0.1 acquire at ") and "Timeout" not in first
    assert second.startswith("3.0.2 acquire at ") and "Timeout (0:00:00" in second
    assert "test_stall_dumps_write_the_stacks_of_an_acquire_that_overruns_only" in second


def test_told_of_a_loss_a_worker_wakes_from_its_sleep_and_sends_no_access(
    tmp_path: Path,
) -> None:
    history = HistoryWriter(tmp_path / "h.jsonl")
    told = Told(history, "0.0.0")
    client = Client(history, "0.0.0", session=None)  # type: ignore[arg-type]
    assert client.perform("read", lambda: 5, lambda v: {"value": v}, told, name="n0") == 5
    threading.Timer(0.1, told.on_lost, [LockLost("lease ran out")]).start()
    began = time.monotonic()
    with pytest.raises(Stop):
        told.sleep(10.0)
    assert time.monotonic() - began < 2.0
    sent: list[int] = []
    with pytest.raises(Stop):
        client.perform("write", lambda: sent.append(1), lambda _: {}, told, name="n0", value=1)
    told.on_lost(LockLost("again"))  # on_lost is called once; a second call records nothing
    assert sent == []
    records, _ = load_history(tmp_path / "h.jsonl")
    kinds = [(r["type"], r.get("f")) for r in records]
    assert kinds == [("invoke", "read"), ("ok", "read"), ("lost", None)]
    assert records[2]["time"] - began >= 0.1


def test_a_sessions_deadline_is_its_lease_end_and_the_control_run_has_none(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    end = lease_end(session)
    assert end is not None
    assert abs(end - (time.monotonic() + session.lease_left)) < 0.05
    assert 0 < session.lease_left <= 2.0 * 0.9
    # The control run's worker replaces the library's deadline: a lease without an end.
    monkeypatch.setattr(lease, "deadline", _never)
    other = session._store.session(app_id="worker", ttl=2.0)
    try:
        assert math.isinf(other.lease_left)
        assert lease_end(other) is None
        for silent in (session, other):  # no heartbeat from now on; the lease timer runs
            session._store._heartbeat.remove(silent)
        time.sleep(2.0)
        assert session.lost  # past its local deadline
        assert not other.lost  # lost only when the database says so
    finally:
        other.close()
