"""`lockwarden hold`: a lock held across the statements of a real shell, and the waiting line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lockwarden.store import Store
from tests.cli.conftest import LOCKWARDEN, Cli, alive, hold, on_terminal, start_hold
from tests.conftest import wait_for

SCRIPT = """
held=$(lockwarden hold {options} job) || exit 9
eval "$held"
echo "$LOCKWARDEN_NAME $LOCKWARDEN_TOKEN $LOCKWARDEN_HOLDER" > "$OUT/held"
lockwarden status --json > "$OUT/during.json"
lockwarden run job -- true 2>/dev/null; echo $? > "$OUT/other"
{end}
"""


def shell(cli: Cli, sh: str, options: str = "", end: str = "") -> subprocess.CompletedProcess[str]:
    env = {**cli.env, "OUT": str(cli.home), "PATH": f"{LOCKWARDEN.parent}:{cli.env['PATH']}"}
    script = SCRIPT.format(options=options, end=end)
    return subprocess.run(
        [sh, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("sh", [s for s in ("sh", "bash", "dash", "zsh") if shutil.which(s)])
def test_a_shell_holds_the_lock_across_statements_until_it_exits(cli: Cli, sh: str) -> None:
    done = shell(cli, sh)
    assert (done.returncode, done.stderr) == (0, ""), done
    name, token, holder = (cli.home / "held").read_text().split()
    assert name == "job"
    during = json.loads((cli.home / "during.json").read_text())
    assert [(e["name"], e["token"], e["pid"]) for e in during["locks"]] == [
        ("job", int(token), int(holder))
    ]
    assert (cli.home / "other").read_text().strip() == "75"  # held while the shell ran
    # The shell has exited: the holder releases and ends (it checks every second).
    wait_for(lambda: cli.status()["locks"] == [], timeout=10, what="the release")
    wait_for(lambda: not alive(int(holder)), timeout=10, what="the holder to end")


def test_kill_releases_at_once_and_json_tells_the_holder(cli: Cli) -> None:
    got = cli("hold", "--json", "--shell-pid", "1" + "0" * 6, "job")  # no such shell: ...
    assert got.status == 0, got
    # ... a shell pid that is gone means released at once: still a valid report.
    shape = json.loads(got.out)
    assert shape["name"] == "job" and shape["token"] >= 1
    wait_for(lambda: cli.status()["locks"] == [], timeout=10, what="the release")

    # Released while the shell still runs: by the kill, not by the shell's exit.
    end = (
        'kill "$LOCKWARDEN_HOLDER"; while kill -0 "$LOCKWARDEN_HOLDER" 2>/dev/null; '
        'do sleep 0.05; done; lockwarden status --json > "$OUT/after.json"'
    )
    done = shell(cli, "sh", end=end)
    assert done.returncode == 0, done
    assert json.loads((cli.home / "after.json").read_text())["locks"] == []


def test_hold_on_a_busy_lock_exits_75_and_prints_no_assignments(cli: Cli) -> None:
    holder = hold(cli, "job", "--app", "first")
    busy = cli("hold", "job")
    assert (busy.status, busy.out) == (75, "")
    assert "held by app 'first'" in busy.error_line()
    assert alive(holder.cmd_pid)


def test_a_broken_hold_says_so_and_exits_70(cli: Cli, tmp_path: Path) -> None:
    err = tmp_path / "holder.err"
    pid = start_hold(cli, err, "--ttl", "1.5", "job")
    assert cli("break", "--yes", "job").status == 0
    wait_for(lambda: not alive(pid), timeout=15, what="the holder to notice")
    assert "lost the write lock on 'job'" in err.read_text()


def test_a_hold_broken_then_ended_says_in_plain_words_what_happened(
    cli: Cli, tmp_path: Path
) -> None:
    """Killed before its next look, the holder finds at its release that the lock was
    broken: it said "was no longer held by this session before it was released"."""
    shell = subprocess.Popen(["sleep", "60"])
    err = tmp_path / "holder.err"
    try:
        pid = start_hold(cli, err, "--ttl", "30", "--shell-pid", str(shell.pid), "job")
        assert cli("break", "--yes", "job").status == 0
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not alive(pid), timeout=15, what="the holder to end")
    finally:
        shell.kill()
        shell.wait()
    said = err.read_text()
    assert "lost the write lock on 'job' (token " in said, said
    assert "was broken or taken over while held" in said, said
    assert "no longer held by this session" not in said


def test_wait_forever_waits_and_shows_who_holds_it_on_a_terminal(cli: Cli, store: Store) -> None:
    session = store.session(app_id="blocker")
    held = session.lock("job")

    def release() -> None:
        time.sleep(0.5)
        held.release()

    seen, status = on_terminal(
        cli, "run", "--wait", "forever", "job", "--", "true", until=b"held by", answer=release
    )
    session.close()
    assert status == 0, seen
    assert b"waiting" in seen and b"for the write lock on 'job': held by app 'blocker'" in seen
    assert seen.endswith(b"\r\x1b[K")  # the line is erased when the wait ends


def test_the_waiting_line_is_not_shown_off_a_terminal_unless_verbose(
    cli: Cli, store: Store
) -> None:
    with store.session(app_id="blocker") as session:
        session.lock("job")
        quiet = cli("run", "--wait", "1.5", "job", "--", "true")
        verbose = cli("run", "--wait", "1.5", "--verbose", "job", "--", "true")
    assert quiet.status == 75 and "waiting" not in quiet.err
    assert verbose.status == 75
    assert " s for the write lock on 'job': held by app 'blocker'" in verbose.err
