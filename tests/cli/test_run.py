"""`lockwarden run`: the real executable in subprocesses, on SQLite and on PostgreSQL."""

from __future__ import annotations

import fcntl
import os
import pty
import shlex
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import lockwarden
from tests.cli.conftest import LOCKWARDEN, Cli, alive, default_signals, hold
from tests.conftest import wait_for


@pytest.mark.parametrize(
    ("script", "status"),
    [("exit 3", 3), ("kill -TERM $$", 128 + 15), ("kill -KILL $$", 128 + 9)],
)
def test_cmd_status_passes_through_and_the_lock_is_released(
    cli: Cli, script: str, status: int
) -> None:
    result = cli("run", "job", "--", "sh", "-c", script)
    assert (result.status, result.err) == (status, "")
    assert cli.status()["locks"] == []


def test_cmd_sees_the_name_and_a_growing_token(cli: Cli) -> None:
    show = ["sh", "-c", 'echo "$LOCKWARDEN_NAME $LOCKWARDEN_TOKEN"']
    first = cli("run", "reports/nightly", "--", *show)
    second = cli("run", "reports/nightly", "--", *show)
    assert (first.status, second.status) == (0, 0), (first, second)
    name, token = first.out.split()
    assert name == "reports/nightly"
    assert int(second.out.split()[1]) > int(token) > 0


def test_cmd_args_are_passed_verbatim(cli: Cli) -> None:
    result = cli("run", "job", "--", "printf", "%s|", "--", "-x", "a b", "--wait")
    assert (result.status, result.out) == (0, "--|-x|a b|--wait|")


def test_a_busy_lock_exits_75_naming_its_holder(cli: Cli) -> None:
    holder = hold(cli, "job", "--app", "nightly-etl")
    busy = cli("run", "job", "--", "touch", str(cli.home / "ran"))
    assert busy.status == 75
    line = busy.error_line()
    assert "'job' is busy" in line
    assert f"'nightly-etl' on {os.uname().nodename} pid {holder.run.pid} (held " in line
    assert not (cli.home / "ran").exists()

    quiet = cli("run", "--conflict-exit-code", "0", "job", "--", "true")
    assert quiet.status == 0 and "busy" in quiet.error_line()
    assert alive(holder.cmd_pid)  # neither disturbed the holder


def test_a_waiting_run_starts_when_the_holder_ends(cli: Cli) -> None:
    started, go, finished = (cli.home / f for f in ("started", "go", "finished"))
    script = f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; touch {finished}"
    first = cli.start("run", "job", "--", "sh", "-c", script)
    wait_for(started.exists, what="the first CMD to start")
    second = cli.start("run", "--wait", "20", "job", "--", "test", "-e", str(finished))
    wait_for(lambda: cli.status()["waiters"], what="the second run to queue")
    go.touch()
    assert first.finish().status == 0
    result = second.finish()
    assert (result.status, result.err) == (0, "")  # its CMD ran after the first one's


def test_a_wait_that_runs_out_exits_75(cli: Cli) -> None:
    hold(cli, "job")
    started = time.monotonic()
    result = cli("run", "--wait", "0.5", "job", "--", "true")
    assert result.status == 75
    assert time.monotonic() - started >= 0.5
    assert "not granted within 0.5 s: held by app 'lockwarden-run'" in result.error_line()
    assert cli.status()["waiters"] == []  # the waiter left nothing behind


def test_readers_share_and_writers_wait(cli: Cli) -> None:
    hold(cli, "doc", "--read")
    assert cli("run", "--read", "doc", "--", "true").status == 0
    assert cli("run", "doc", "--", "true").status == 75
    assert cli("run", "--write", "doc", "--", "true").status == 75


@pytest.mark.slow
def test_a_killed_holder_takes_cmd_with_it_and_its_lock_passes_on_after_the_ttl(
    cli: Cli,
) -> None:
    holder = hold(cli, "job", "--ttl", "3")  # long enough for a try on a busy machine
    token = cli.status()["locks"][0]["token"]
    holder.run.proc.send_signal(signal.SIGKILL)
    if sys.platform == "linux":  # the parent-death signal: CMD does not run on unlocked
        wait_for(lambda: not alive(holder.cmd_pid), timeout=5, what="CMD to die")
    # status judges by the TTL alone (it may run on another host than the holder's).
    wait_for(lambda: cli.status()["locks"][0]["stale"], what="the status to flag it stale")
    assert "STALE" in cli("status").out
    result = cli("run", "--wait", "10", "job", "--", "sh", "-c", "echo $LOCKWARDEN_TOKEN")
    assert result.status == 0, result
    assert int(result.out) > token


def test_a_holder_killed_on_this_machine_is_taken_over_at_once(cli: Cli) -> None:
    holder = hold(cli, "job", "--ttl", "60")
    token = cli.status()["locks"][0]["token"]
    holder.run.proc.send_signal(signal.SIGKILL)
    if sys.platform == "linux":
        wait_for(lambda: not alive(holder.cmd_pid), timeout=5, what="CMD to die")
    # Its pid is gone: a try on the same machine takes the lock over, long before the TTL.
    result = cli("run", "job", "--", "sh", "-c", "echo $LOCKWARDEN_TOKEN")
    assert result.status == 0, result
    assert int(result.out) > token


def test_a_broken_lock_stops_cmd_and_exits_70(cli: Cli) -> None:
    holder = hold(cli, "job", "--ttl", "1")
    broke = cli("break", "--yes", "job")
    assert broke.status == 0, broke
    result = holder.run.finish(timeout=10)
    assert result.status == 70
    line = result.error_line()
    assert "lost the write lock on 'job'" in line and "CMD was sent SIGTERM" in line
    assert "broken or taken over" in line
    assert holder.terminated()


def test_cmd_that_ignores_sigterm_is_killed_after_kill_after(cli: Cli) -> None:
    started = cli.home / "started"
    script = f"trap '' TERM; touch {started}; exec sleep 30"
    running = cli.start("run", "--ttl", "1", "--kill-after", "0.5", "job", "--", "sh", "-c", script)
    wait_for(started.exists, what="CMD to start")
    assert cli("break", "--yes", "job").status == 0
    result = running.finish(timeout=10)
    assert result.status == 70
    assert "then SIGKILL after 0.5 s" in result.error_line()


@pytest.mark.slow
def test_a_frozen_run_loses_its_lock_to_a_waiter_and_kills_cmd_on_resume(cli: Cli) -> None:
    holder = hold(cli, "job", "--ttl", "1")
    os.kill(holder.run.pid, signal.SIGSTOP)
    try:
        taken = cli("run", "--wait", "10", "job", "--", "true")
        assert taken.status == 0, taken  # reclaimed from the frozen holder after its TTL
        assert not holder.terminated()  # nobody could tell CMD yet
    finally:
        os.kill(holder.run.pid, signal.SIGCONT)
    result = holder.run.finish(timeout=10)
    assert result.status == 70
    # The lock may be the waiter's already: CMD gets no grace in which to go on.
    assert "lost the write lock on 'job'" in result.error_line()
    assert "SIGKILL at once, the lease having run out" in result.error_line()
    assert not holder.terminated()
    assert not Path(f"/proc/{holder.cmd_pid}").exists()


def _on_the_terminal() -> None:
    """The pty becomes the controlling terminal, lockwarden's group its foreground, and
    lockwarden hears SIGINT however the test run was started (`default_signals`)."""
    default_signals()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT])
def test_signals_reach_cmd_and_the_lock_is_released_after_it_ends(
    cli: Cli, signum: signal.Signals
) -> None:
    started = cli.home / "started"
    script = f"trap 'echo got {signum.name}; exit 7' {signum.name[3:]}; touch {started}; "
    script += "while :; do sleep 0.05; done"
    running = cli.start("run", "job", "--", "sh", "-c", script)
    wait_for(started.exists, what="CMD to start")
    running.proc.send_signal(signum)
    result = running.finish()
    assert (result.status, result.out, result.err) == (7, f"got {signum.name}\n", "")
    assert cli.status()["locks"] == []


def test_a_signal_sent_while_run_is_stopped_reaches_cmd_on_resume(cli: Cli) -> None:
    """As `kill %1` does to a stopped job: SIGTERM, then SIGCONT. While lockwarden is
    stopped the kernel may leave the signal to any of its threads to take."""
    holder = hold(cli, "job")
    for signum in (signal.SIGSTOP, signal.SIGTERM, signal.SIGCONT):
        os.kill(holder.run.pid, signum)
    result = holder.run.finish(timeout=10)
    assert (result.status, result.err) == (0, "")  # CMD's own status after its TERM trap
    assert holder.terminated()


def test_ctrl_c_on_a_terminal_reaches_cmd_once(cli: Cli) -> None:
    """The terminal interrupts CMD itself; lockwarden must not interrupt it a second time."""
    started, seen = cli.home / "started", cli.home / "seen"
    cmd = (
        "import signal, time; "
        f"signal.signal(signal.SIGINT, lambda *a: open({str(seen)!r}, 'a').write('INT\\n')); "
        f"open({str(started)!r}, 'w').close(); time.sleep(1.5)"
    )
    main, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [str(LOCKWARDEN), "run", "job", "--", sys.executable, "-c", cmd],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            env=cli.env,
            start_new_session=True,
            preexec_fn=_on_the_terminal,  # noqa: PLW1509
        )
        wait_for(started.exists, what="CMD to start")
        # lockwarden handles its copy only after CMD has handled its own: two
        # signals close together could merge into one and hide a second send.
        os.kill(proc.pid, signal.SIGSTOP)
        os.write(main, b"\x03")  # Ctrl-C
        wait_for(seen.exists, what="CMD to get SIGINT from the terminal")
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=10) == 0
    finally:
        os.close(main)
        os.close(terminal)
    assert seen.read_text() == "INT\n"


def test_an_ignored_signal_stays_ignored(cli: Cli) -> None:
    """Under nohup (SIGHUP ignored), a hang-up must not reach CMD through lockwarden."""
    started = cli.home / "started"
    script = f"touch {started}; sleep 0.5"
    running = cli.start("run", "job", "--", "sh", "-c", script, via="trap '' HUP; exec")
    wait_for(started.exists, what="CMD to start")
    running.proc.send_signal(signal.SIGHUP)
    result = running.finish()
    assert (result.status, result.err) == (0, "")


def test_a_signal_while_waiting_gives_up_cleanly(cli: Cli) -> None:
    hold(cli, "job")
    waiting = cli.start("run", "--wait", "30", "job", "--", "touch", str(cli.home / "ran"))
    wait_for(lambda: cli.status()["waiters"], what="the run to queue")
    waiting.proc.send_signal(signal.SIGTERM)
    result = waiting.finish()
    assert result.status == 128 + signal.SIGTERM
    assert "SIGTERM received" in result.error_line()
    assert cli.status()["waiters"] == []
    assert not (cli.home / "ran").exists()


BLOCKER = """
import os, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
with open(sys.argv[2], "w") as marker:
    marker.write(str(os.getpid()))
time.sleep(60)
"""
"""Holds the SQLite file's write lock: every write of lockwarden waits, then fails."""


@pytest.mark.slow
def test_a_failed_release_keeps_cmds_status_and_says_so(sqlite_url: str, tmp_path: Path) -> None:
    """CMD ends with 7; the database then refuses writes (another process holds its write
    lock past the call timeout, 1 s here), so the release fails. CMD's work is done:
    the status stays 7, and one line says the lock could not be released."""
    lockwarden.connect(sqlite_url).close()
    cli = Cli(sqlite_url, tmp_path)
    marker = tmp_path / "blocking"
    database = sqlite_url.removeprefix("sqlite:///")
    blocker = [sys.executable, "-c", BLOCKER, database, str(marker)]
    cmd = (
        f"{shlex.join(blocker)} >/dev/null 2>&1 & "
        f'while [ ! -s "{marker}" ]; do sleep 0.01; done; exit 7'
    )
    try:
        result = cli(
            "--call-timeout", "1", "run", "--ttl", "120", "job", "--", "sh", "-c", cmd, timeout=120
        )
    finally:
        if marker.exists():
            os.kill(int(marker.read_text()), signal.SIGKILL)
    assert result.status == 7, result
    line = result.error_line()
    assert "CMD exited with status 7, but releasing the write lock on 'job'" in line
    assert "database is locked" in line
