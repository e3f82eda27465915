"""The worker's look for names a refused multi-lock left held waits for the session's
releases retried in the background, and says how many were still pending."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockwarden
from chaos.worker import StallDumps, _settled
from lockwarden.store import Session
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
