"""A process that ends without `close()` leaves nothing for a TTL: real processes, both backends."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import lockwarden
from lockwarden.store import Store, process
from tests.conftest import Background, Child

TTL = 30.0
"""Far above anything a test waits: a lock freed in time was freed by exit, not by the TTL."""

HOLD = """
import sys, lockwarden
store = lockwarden.connect(sys.argv[1])
session = store.session(app_id="exiting", ttl={ttl})
lock = session.lock("job")
print("locked", lock.token, flush=True)
"""

ENDINGS = {  # how the process ends, and its exit status
    "falls off the end": ("", 0),
    "sys.exit": ("sys.exit(3)", 3),
    "uncaught exception": ("raise RuntimeError('boom')", 1),
    "holding a SharedLock too": ("shared = session.Lock('job2'); shared.acquire()", 0),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_process_that_exits_without_close_releases_its_locks_at_once(
    store: Store, url: str, ending: str
) -> None:
    last, status = ENDINGS[ending]
    code = HOLD.format(ttl=TTL) + last + "\n"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code, url], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.stdout.startswith("locked"), result.stderr
    assert result.returncode == status, result.stderr
    assert store.locks() == []
    with store.session(app_id="next") as s:
        assert s.try_lock("job") is not None
    assert time.monotonic() - started < TTL / 2


def test_a_holder_killed_on_this_machine_is_taken_over_well_before_its_ttl(
    store: Store, url: str
) -> None:
    holder = Child("holder", url, "job", str(TTL))
    try:
        assert holder.expect()["event"] == "locked"
        with store.session(app_id="waiter") as s:
            assert s.try_lock("job") is None  # alive: its lock stands
            waiting = Background(lambda: s.lock("job", timeout=TTL / 2))
            time.sleep(0.3)  # the waiter is queued behind the live holder
            attempts = store.stats["attempts"]
            time.sleep(1.0)  # four looks at the holder's pid, none at the database
            assert store.stats["attempts"] == attempts
            started = time.monotonic()
            os.kill(holder.pid, signal.SIGKILL)  # no atexit, no release: only its pid is gone
            got = waiting.result(timeout=TTL)
            assert time.monotonic() - started < 5.0
            assert [e.holder.app_id for e in store.locks("job")] == ["waiter"]
            got.release()
    finally:
        holder.kill()


def test_an_asyncio_waiter_takes_over_from_a_killed_holder_well_before_its_ttl(
    store: Store, url: str
) -> None:
    holder = Child("holder", url, "job", str(TTL))

    async def wait_while_it_dies() -> float:
        with store.session(app_id="async-waiter") as s:
            waiting = asyncio.ensure_future(s.lock_async("job", timeout=TTL / 2))
            await asyncio.sleep(0.3)
            killed = time.monotonic()
            os.kill(holder.pid, signal.SIGKILL)
            got = await waiting
            took = time.monotonic() - killed
            await asyncio.to_thread(got.release)
            return took

    try:
        assert holder.expect()["event"] == "locked"
        assert asyncio.run(wait_while_it_dies()) < 5.0
    finally:
        holder.kill()


def test_a_try_takes_over_from_a_killed_holder_at_once(store: Store, url: str) -> None:
    holder = Child("holder", url, "job", str(TTL))
    try:
        first = holder.expect()
        os.kill(holder.pid, signal.SIGKILL)
        holder.proc.wait()
        with store.session(app_id="next") as s:
            lock = s.try_lock("job")
            assert lock is not None
            assert lock.token > first["token"]
    finally:
        holder.kill()


def test_process_identity_tells_a_reused_pid_from_its_first_owner() -> None:
    me = process.identity()
    if me is None:
        pytest.skip("no /proc: only the TTL judges holders here")
    alive = {"pid": os.getpid(), "pid_start": me}
    assert process.local(alive) and not process.gone(alive)
    machine, _, start = me.rpartition("/")
    # The same pid, started at another moment: a later process reusing the pid.
    assert process.gone(alive | {"pid_start": f"{machine}/{int(start) + 1}"})
    # Another boot, another pid namespace, or nothing recorded: only the TTL can tell.
    assert not process.gone(alive | {"pid_start": f"other-boot/pid:[1]/{start}"})
    assert not process.gone(alive | {"pid_start": None})
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process.gone({"pid": child.pid, "pid_start": f"{machine}/{start}"})


def test_a_zombie_holder_counts_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    identity = process.identity(child.pid)
    if identity is None:
        pytest.skip("no /proc")
    row = {"pid": child.pid, "pid_start": identity}
    assert not process.gone(row)
    child.kill()
    deadline = time.monotonic() + 10
    while not process.gone(row):  # dead, not yet reaped: a zombie
        assert time.monotonic() < deadline
        time.sleep(0.01)
    child.wait()


def test_a_dropped_shared_lock_is_released(store: Store) -> None:
    with store.session(app_id="t") as s:
        lock = s.Lock("dropped")
        assert lock.acquire()
        del lock  # no release: the finalizer hands it to the heartbeat thread
        deadline = time.monotonic() + 5
        while store.locks("dropped"):
            assert time.monotonic() < deadline, "a dropped lock was not released"
            time.sleep(0.01)
        assert s.held == []


def test_exit_leaves_the_locks_of_other_stores_of_the_same_database(store: Store, url: str) -> None:
    with store.session(app_id="mine") as s:
        mine = s.lock("kept")
        code = HOLD.format(ttl=TTL).replace('"job"', '"other"')
        subprocess.run([sys.executable, "-c", code, url], check=True, capture_output=True)
        mine.check()
        assert [e.name for e in store.locks()] == ["kept"]


def test_closing_at_exit_does_not_wait_for_a_thread_still_taking_a_lock(url: str) -> None:
    code = textwrap.dedent(
        """
        import sys, threading, lockwarden
        store = lockwarden.connect(sys.argv[1])
        holder = store.session(app_id="h", ttl=30).lock("busy")
        waiter = store.session(app_id="w", ttl=30)
        threading.Thread(target=lambda: waiter.lock("busy"), daemon=True).start()
        print("ok", flush=True)
        """
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code, url], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.stdout == "ok\n", result.stderr
    assert time.monotonic() - started < 20
    with lockwarden.connect(url) as again:
        assert again.locks() == []
        assert again.waiters() == []


def test_a_process_found_alive_is_not_read_again_soon_but_its_end_is_seen_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter looks at every process in its way on each attempt: reading /proc each time
    cost a contended acquisition more client time than any other step."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    identity = process.identity(child.pid)
    if identity is None:
        child.kill()
        pytest.skip("no /proc")
    reads: list[int] = []
    real = process._stat

    def counted(pid: int) -> tuple[str, str] | None:
        reads.append(pid)
        return real(pid)

    monkeypatch.setattr(process, "_stat", counted)
    row = {"pid": child.pid, "pid_start": identity}
    try:
        assert not any(process.gone(row) for _ in range(50))
        assert len(reads) == 1  # then only asked whether the pid exists
    finally:
        child.kill()
        child.wait()
    assert process.gone(row)  # reaped: its pid is free, seen without waiting for a full look
