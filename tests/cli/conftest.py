"""Fixtures for the command line's tests: the real ``lockwarden`` executable, in subprocesses.

Every test gets a fresh store on each backend (the store tests' ``url``
fixture) and a private HOME and state directory, so nothing here can touch
the developer's own default database.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import lockwarden
from tests.conftest import wait_for

LOCKWARDEN = Path(sys.executable).with_name("lockwarden")


class Result:
    """How a finished ``lockwarden`` ended: status, stdout, stderr."""

    def __init__(self, status: int, out: str, err: str) -> None:
        self.status = status
        self.out = out
        self.err = err

    def error_line(self) -> str:
        """The one line a failure must print on stderr (and nothing else)."""
        assert "Traceback" not in self.err, self.err
        lines = self.err.splitlines()
        assert len(lines) == 1, f"expected one line on stderr, got: {self.err!r}"
        if lines[0].startswith("{"):  # --json: the failure as an object, its status in it
            shape = json.loads(lines[0])
            assert shape["status"] == self.status and shape["prog"].startswith("lockwarden")
            message: str = shape["error"]
            return message
        assert lines[0].startswith("lockwarden"), lines[0]
        return lines[0]

    def __repr__(self) -> str:
        return f"<Result {self.status} out={self.out!r} err={self.err!r}>"


def default_signals() -> None:
    """Undo what the test run may have inherited: under ``nohup`` SIGHUP is ignored, and a
    shell's background job ignores SIGINT and SIGQUIT; ignored signals stay ignored across
    exec, so ``lockwarden run`` would rightly neither see nor forward them."""
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)


class Running:
    """A ``lockwarden`` started in the background; its output goes to files.

    Files, not pipes: a CMD that outlives a killed ``lockwarden`` would hold
    a pipe open and make reading it hang.
    """

    def __init__(self, argv: list[str], env: dict[str, str], directory: Path) -> None:
        self._out = directory / f"out-{time.monotonic_ns()}"
        self._err = self._out.with_suffix(".err")
        with self._out.open("w") as out, self._err.open("w") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,  # no controlling terminal: signals come from the test
                preexec_fn=default_signals,  # noqa: PLW1509  (three dispositions, no lock)
            )
        self.pid = self.proc.pid

    def finish(self, timeout: float = 30.0) -> Result:
        status = self.proc.wait(timeout)
        return Result(status, self._out.read_text(), self._err.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Cli:
    """Runs ``lockwarden`` against one store, as a user's shell would."""

    def __init__(self, url: str, home: Path) -> None:
        self.url = url
        self.home = home
        self.env = {
            # Not the size pytest-xdist's workers set: a terminal's is its own (`in_terminal`).
            **{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
            "LOCKWARDEN_DB": url,
            "HOME": str(home),
            "XDG_STATE_HOME": str(home / "state"),
        }
        self._running: list[Running] = []
        self.cmds: dict[int, str] = {}
        """CMDs started by `hold`, by pid, with a word of their command line: a failed
        test may leave one orphaned, and the clean-up must not kill a stranger."""

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 30
    ) -> Result:
        done = subprocess.run(
            [str(LOCKWARDEN), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env or self.env,
            timeout=timeout,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)

    def start(self, *args: str, via: str = "") -> Running:
        """Start ``lockwarden args...`` in the background; ``via``: a shell prefix that execs it."""
        argv = [str(LOCKWARDEN), *args]
        if via:  # e.g. "trap '' HUP; exec": the shell becomes lockwarden, same pid
            argv = ["sh", "-c", f'{via} "$0" "$@"', *argv]
        running = Running(argv, self.env, self.home)
        self._running.append(running)
        return running

    def status(self) -> dict[str, Any]:
        result = self("status", "--json")
        assert result.status == 0, result
        shape: dict[str, Any] = json.loads(result.out)
        return shape

    def close(self) -> None:
        for running in self._running:
            running.kill()
        for pid, marker in self.cmds.items():
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(params=["sqlite", "postgres"])
def sql_url(request: pytest.FixtureRequest) -> str:
    """A fresh store on each backend with tables: what a schema, or a row written by
    hand, needs (an etcd store has neither)."""
    value: str = request.getfixturevalue(f"{'pg' if request.param == 'postgres' else 'sqlite'}_url")
    return value


@pytest.fixture
def cli(url: str, tmp_path: Path) -> Iterator[Cli]:
    """A runner on a fresh store, created (as `lockwarden init` would) so that
    the commands that never create one find it."""
    assert LOCKWARDEN.exists(), f"{LOCKWARDEN} is missing: install the package (pip install -e .)"
    lockwarden.connect(url).close()
    runner = Cli(url, tmp_path)
    yield runner
    runner.close()


@dataclass
class Held:
    """A ``lockwarden run`` whose CMD runs until it is stopped."""

    run: Running
    cmd_pid: int
    log: Path
    """CMD writes "TERM" here when it gets SIGTERM (it then exits 0, as well-behaved jobs do)."""

    def terminated(self) -> bool:
        return self.log.exists() and "TERM" in self.log.read_text()


def hold(cli: Cli, name: str, *options: str) -> Held:
    """Start ``lockwarden run [options] name`` and return once its CMD runs (the lock is held)."""
    started = cli.home / f"started-{time.monotonic_ns()}"
    log = started.with_suffix(".log")
    script = (
        f'trap \'echo TERM >> "{log}"; exit 0\' TERM; echo $$ > "{started}"; '
        "while :; do sleep 0.05; done"
    )
    running = cli.start("run", *options, name, "--", "sh", "-c", script)

    def cmd_started() -> bool:
        if running.proc.poll() is not None:
            raise AssertionError(f"lockwarden run {name} ended: {running.finish()}")
        return started.exists() and started.read_text().endswith("\n")

    wait_for(cmd_started, what="CMD to start")
    cmd_pid = int(started.read_text())
    cli.cmds[cmd_pid] = str(started)
    return Held(running, cmd_pid, log)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def on_terminal(
    cli: Cli,
    *args: str,
    until: bytes,
    answer: str | Callable[[], object] = "",
    timeout: float = 30,
) -> tuple[bytes, int]:
    """Run ``lockwarden args...`` with a terminal for stdin, stdout and stderr.

    Reads what it shows until ``until`` appears, then types ``answer`` (or
    calls it), and reads on until it exits. Returns everything shown (raw
    bytes) and the status.
    """
    main, terminal = pty.openpty()
    # Wide enough that a table row is not wrapped in the middle of a name.
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 300, 0, 0))
    try:
        proc = subprocess.Popen(
            [str(LOCKWARDEN), *args], stdin=terminal, stdout=terminal, stderr=terminal, env=cli.env
        )
        seen = b""
        deadline = time.monotonic() + timeout
        answered = False
        while True:
            if not answered and until in seen:
                if callable(answer):
                    answer()
                else:
                    os.write(main, answer.encode())
                answered = True
            if answered and proc.poll() is not None:
                break
            assert time.monotonic() < deadline, seen
            if select.select([main], [], [], 0.1)[0]:
                try:
                    seen += os.read(main, 4096)
                except OSError:  # the terminal closed with the process
                    break
        status = proc.wait(timeout=timeout)
        while select.select([main], [], [], 0.1)[0]:
            try:
                chunk = os.read(main, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        return seen, status
    finally:
        os.close(main)
        os.close(terminal)


def start_hold(cli: Cli, err: Path, *args: str) -> int:
    """Run ``lockwarden hold args...`` as a shell's ``$(...)`` would, its holder's stderr
    going to ``err``; the holder's pid, once the lock is held."""
    with err.open("w") as stderr:
        got = subprocess.run(
            [str(LOCKWARDEN), "hold", *args],
            env=cli.env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            timeout=60,
            check=True,
        )
    return int(got.stdout.split("LOCKWARDEN_HOLDER=")[1].split(";")[0])
