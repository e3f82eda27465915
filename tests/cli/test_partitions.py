"""`lockwarden run` cut off from its database: CMD has ended before anyone else holds the lock.

The first run reaches the store through proxies frozen into a blackhole
(`chaos.proxy`), or cut (connections reset and refused); a second run
reaches it straight and waits for the lock. CMD writes a line with the time
every 50 ms (its sign of life); the second run's CMD writes the time it got
the lock. On PostgreSQL, MariaDB and a 3-member etcd cluster.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import Cli, Result, start_hold
from tests.conftest import Partitionable, wait_for

pytestmark = pytest.mark.slow

LIFE = "while :; do date +%s.%N >> {life}; sleep 0.05; done"


@pytest.fixture
def far(partitionable: Partitionable, tmp_path: Path) -> Iterator[Cli]:
    """A command line that reaches the store through the proxies."""
    runner = Cli(partitionable.far, tmp_path)
    yield runner
    runner.close()


def few_lines(result: Result, most: int = 3) -> list[str]:
    """stderr's lines: at most ``most``, each one of lockwarden's own, none stating a time
    in the future ("from now": it will have passed when someone reads it)."""
    lines = result.err.splitlines()
    assert 1 <= len(lines) <= most, result.err
    for line in lines:
        assert line.startswith("lockwarden: "), result.err
        assert "from now" not in line, line
    assert "Traceback" not in result.err
    return lines


def last_time(path: Path) -> float:
    return float(path.read_text().split()[-1])


@pytest.mark.parametrize("cmd", ["plain", "ignores SIGTERM"])
def test_a_cut_off_run_has_ended_cmd_before_another_run_is_granted(
    partitionable: Partitionable, far: Cli, tmp_path: Path, cmd: str
) -> None:
    life, got = tmp_path / "life", tmp_path / "got"
    script = ("trap '' TERM; " if cmd == "ignores SIGTERM" else "") + LIFE.format(life=life)
    first = far.start("run", "--ttl", "3", "job", "--", "sh", "-c", script)
    wait_for(life.exists, what="CMD to start")
    time.sleep(0.5)
    partitionable.freeze()
    try:
        second = Cli(partitionable.near, tmp_path)(
            "run", "--wait", "60", "job", "--", "sh", "-c", f"date +%s.%N > {got}", timeout=90
        )
        assert second.status == 0, second
        result = first.finish(timeout=30)
    finally:
        partitionable.thaw()
    assert result.status == 70, result
    lines = few_lines(result)
    assert "lost the write lock on 'job'" in lines[-1]
    assert "no heartbeat was confirmed" in lines[-1]
    if cmd == "ignores SIGTERM":
        assert "SIGKILL" in lines[-1] and "as the lease ran out" in lines[-1]
    assert last_time(life) < last_time(got), "CMD still ran when the other run got the lock"


def test_a_run_whose_database_goes_away_exits_70_not_with_cmds_status(
    partitionable: Partitionable, far: Cli, tmp_path: Path
) -> None:
    life, got = tmp_path / "life", tmp_path / "got"
    script = f"trap 'exit 9' TERM; {LIFE.format(life=life)}"
    first = far.start("run", "--ttl", "3", "job", "--", "sh", "-c", script)
    wait_for(life.exists, what="CMD to start")
    partitionable.cut()  # every connection reset, new ones refused
    second = Cli(partitionable.near, tmp_path)(
        "run", "--wait", "60", "job", "--", "sh", "-c", f"date +%s.%N > {got}", timeout=90
    )
    assert second.status == 0, second
    result = first.finish(timeout=30)
    assert result.status == 70, result  # not CMD's 9: the lock was lost while it ran
    lines = few_lines(result)
    assert "lost the write lock on 'job'" in lines[-1]
    assert last_time(life) < last_time(got)


@pytest.mark.parametrize("command", [["run", "job", "--", "true"], ["status"]])
def test_a_command_against_a_partitioned_database_exits_69_within_10_s(
    partitionable: Partitionable, far: Cli, command: list[str]
) -> None:
    partitionable.freeze()
    started = time.monotonic()
    result = far(*command)
    assert time.monotonic() - started < 10.0
    assert result.status == 69, result
    assert "no answer within" in result.error_line() or "no member answered" in result.error_line()


def test_a_try_once_behind_a_frozen_writer_of_a_sqlite_store_fails_in_bounded_time(
    tmp_path: Path,
) -> None:
    database = tmp_path / "locks.db"
    cli = Cli(f"sqlite:///{database}", tmp_path)
    assert cli("init").status == 0
    writer = str(database) + "-writer"
    frozen = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, signal, sys\n"
            f"fd = os.open({writer!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGSTOP)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert frozen.stdout is not None and frozen.stdout.readline() == "held\n"
        started = time.monotonic()
        result = cli("run", "job", "--", "true")
        assert time.monotonic() - started < 10.0
        assert result.status == 69, result
        line = result.error_line()
        assert f"process {frozen.pid} holds the store's write lock" in line
        assert "paused or stuck inside a write" in line
    finally:
        frozen.kill()
        frozen.wait()
    assert cli("run", "job", "--", "true").status == 0  # the lock file is free again


def test_a_sqlite_holder_whose_heartbeat_waits_behind_a_frozen_writer_is_lost_in_time(
    tmp_path: Path,
) -> None:
    import lockwarden  # noqa: PLC0415

    told: list[float] = []
    with lockwarden.connect(f"sqlite:///{tmp_path / 'locks.db'}") as store:
        session = store.session("held", ttl=2.0, on_lost=lambda exc: told.append(time.monotonic()))
        session.lock("job")
        fd = os.open(str(tmp_path / "locks.db-writer"), os.O_RDWR)
        pid = os.fork()
        if pid == 0:  # a writer that takes the lock file and freezes
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(0)
        try:
            frozen_at = time.monotonic()
            wait_for(lambda: told, timeout=3.0, what="on_lost")
            assert told[0] - frozen_at < 2.0
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
        assert session.lost
        session.close()


def test_a_cut_off_hold_ends_its_holder_by_the_lease(
    partitionable: Partitionable, far: Cli, tmp_path: Path
) -> None:
    err = tmp_path / "holder.err"
    holder = start_hold(far, err, "--ttl", "3", "job")
    partitionable.freeze()
    try:
        cut = time.monotonic()
        wait_for(lambda: "lost the write lock on 'job'" in err.read_text(), timeout=3 * 0.9 + 1)
        said = time.monotonic()
        taker = Cli(partitionable.near, tmp_path)
        second = taker("run", "--wait", "60", "job", "--", "true", timeout=90)
        assert second.status == 0, second
        assert said - cut < 3 * 0.9 + 0.5
        wait_for(lambda: not Path(f"/proc/{holder}").exists(), timeout=15, what="the holder")
    finally:
        partitionable.thaw()
    lines = err.read_text().splitlines()
    assert 1 <= len(lines) <= 3 and all(line.startswith("lockwarden: ") for line in lines)
