"""Every call bounded in time (`lockwarden.store.bounds`): deadlines, and the cutter that ends
a blocking read whose time is up."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import ExitStack

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lockwarden
from lockwarden import LockUsageError
from lockwarden.store import bounds


def test_a_call_gets_its_call_timeout_unless_an_enclosing_bound_is_sooner() -> None:
    now = time.monotonic()
    assert now + 5 <= bounds.deadline(5.0) <= time.monotonic() + 5
    with bounds.within(1.0):
        assert bounds.deadline(5.0) <= now + 1.0 + 0.1
        with bounds.within(10.0):  # an inner bound never widens an outer one
            assert bounds.deadline(5.0) <= now + 1.0 + 0.1
        assert bounds.deadline(0.5) <= time.monotonic() + 0.5
    assert bounds.deadline(5.0) >= now + 5


@given(st.lists(st.floats(min_value=-1.0, max_value=100.0), min_size=1, max_size=5))
def test_nested_bounds_end_at_the_soonest(spans: list[float]) -> None:
    start = time.monotonic()
    with ExitStack() as stack:
        for span in spans:
            stack.enter_context(bounds.within(span))
        end = bounds.deadline(1000.0)
    soonest = max(0.0, min(spans))
    assert start + soonest <= end <= time.monotonic() + soonest
    assert bounds.deadline(1000.0) > time.monotonic() + 999  # all undone on the way out


def test_a_bound_is_the_calling_threads_alone() -> None:
    seen: list[float] = []
    with bounds.within(0.5):
        thread = threading.Thread(target=lambda: seen.append(bounds.deadline(100.0)))
        thread.start()
        thread.join()
    assert seen[0] > time.monotonic() + 90


def test_the_cutter_ends_a_blocked_read_at_its_deadline() -> None:
    ours, theirs = socket.socketpair()
    try:
        started = time.monotonic()
        with bounds.CUTTER.watch(ours.fileno(), started + 0.2) as watched:
            data = ours.recv(10)  # nobody writes: blocked until the socket is shut down
        assert data == b""
        assert watched.cut
        assert 0.15 < time.monotonic() - started < 2.0
    finally:
        ours.close()
        theirs.close()


def test_a_call_that_ends_in_time_is_left_alone_and_its_descriptor_reused_safely() -> None:
    ours, theirs = socket.socketpair()
    with bounds.CUTTER.watch(ours.fileno(), time.monotonic() + 0.1) as watched:
        theirs.send(b"x")
        assert ours.recv(1) == b"x"
    ours.close()
    theirs.close()
    # The descriptor's number may now be another socket's: the cutter must not touch it.
    again, other = socket.socketpair()
    try:
        time.sleep(0.3)
        assert not watched.cut
        other.send(b"y")
        assert again.recv(1) == b"y"  # not shut down
    finally:
        again.close()
        other.close()


def test_a_bad_call_timeout_is_refused(tmp_path: object) -> None:
    for bad in (0, -1, float("nan"), "5"):
        with pytest.raises(LockUsageError, match="call_timeout"):
            lockwarden.connect("sqlite:///never.db", call_timeout=bad)  # type: ignore[arg-type]
