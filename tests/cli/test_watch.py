"""`lockwarden status --watch`, `metrics` and `dashboard`: watching a store from the shell."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import termios
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lockwarden.store import Store
from tests.cli.conftest import LOCKWARDEN, Cli


def test_metrics_prints_one_scrape_in_prometheus_text(cli: Cli, store: Store) -> None:
    store.session(app_id="cron").lock("nightly")
    result = cli("metrics")
    assert result.status == 0, result
    held = {f.name: f for f in text_string_to_metric_families(result.out)}["lockwarden_locks_held"]
    assert any(
        s.labels == {"mode": "write", "name": "nightly"} and s.value == 1 for s in held.samples
    )


def test_metrics_never_creates_a_store(cli: Cli, tmp_path: object) -> None:
    result = cli("metrics", "--db", f"sqlite:///{cli.home}/nothing-here.db")
    assert result.status == 69 and "lockwarden init" in result.err


def test_status_watch_redraws_until_interrupted(cli: Cli, store: Store) -> None:
    session = store.session(app_id="cron")
    main, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 300, 0, 0))
    proc = subprocess.Popen(
        [str(LOCKWARDEN), "status", "--watch", "0.2"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=cli.env,
    )
    seen = b""

    def read_until(text: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 20
        while text not in seen:
            assert time.monotonic() < deadline, seen
            if select.select([main], [], [], 0.1)[0]:
                seen += os.read(main, 65536)

    try:
        read_until(b"no locks held")
        session.lock("nightly")  # appears without restarting the command
        read_until(b"nightly")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        os.close(main)
        os.close(terminal)


class Piped:
    """``lockwarden status --watch ...`` with stdout a pipe, read while it runs."""

    def __init__(self, cli: Cli, *args: str) -> None:
        self.proc = subprocess.Popen(
            [str(LOCKWARDEN), "status", "--watch", "0.2", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli.env,
        )
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.fileno()
        self.seen = b""

    def read_until(self, text: bytes, timeout: float = 20, start: int = 0) -> bytes:
        """What it printed up to ``text`` (past ``start``), which must come while it runs."""
        deadline = time.monotonic() + timeout
        while text not in self.seen[start:]:
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, f"{text!r} did not come: {self.seen!r}"
            if select.select([self.out], [], [], 0.1)[0]:
                self.seen += os.read(self.out, 65536)
        return self.seen

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=20)
        assert err == b"", err
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def test_status_watch_into_a_pipe_prints_each_frame_at_once(cli: Cli, store: Store) -> None:
    """Into a pipe or a file every frame is written as it is drawn (rich's Live, off a
    terminal, printed nothing until the command ended: 0 bytes after 10 minutes)."""
    session = store.session(app_id="cron")
    piped = Piped(cli)
    try:
        piped.read_until(b"no locks held")
        session.lock("nightly")
        seen = piped.read_until(b"nightly")
        assert b"\x1b[" not in seen  # frames one after another, not redrawn in place
        assert piped.stop() == 0
    finally:
        piped.kill()


def test_status_watch_json_prints_one_status_object_per_line(cli: Cli, store: Store) -> None:
    """JSON Lines, each line the shape of `status --json` (--json was ignored with --watch)."""
    session = store.session(app_id="cron")
    piped = Piped(cli, "--json")
    try:
        piped.read_until(b"\n")
        session.lock("nightly")
        seen = piped.read_until(b'"nightly"')
        piped.read_until(b"\n", start=seen.index(b'"nightly"'))
        assert piped.stop() == 0
    finally:
        piped.kill()
    lines = piped.seen.decode().splitlines()
    if not piped.seen.endswith(b"\n"):
        lines.pop()  # cut short by the interrupt
    frames = [json.loads(line) for line in lines]
    once = cli.status()
    assert all(frame.keys() == once.keys() for frame in frames)
    assert frames[0]["locks"] == [] and frames[0]["database"] == once["database"]
    [held] = [frame for frame in frames if frame["locks"]][-1]["locks"]
    assert held.keys() == once["locks"][0].keys()
    assert (held["name"], held["mode"], held["app_id"]) == ("nightly", "write", "cron")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_dashboard_serves_the_page_and_metrics_on_loopback(cli: Cli, store: Store) -> None:
    store.session(app_id="web").lock("deploy")
    port = free_port()
    running = cli.start("dashboard", "--port", str(port), "--token", "t0k")
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            reply = httpx.get(f"{base}/snapshot.json?token=t0k")
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.1)
    assert [lock["name"] for lock in reply.json()["locks"]] == ["deploy"]
    assert httpx.get(f"{base}/metrics").status_code == 401  # the token guards everything
    assert "lockwarden_locks_held" in httpx.get(f"{base}/metrics?token=t0k").text
    running.kill()


def test_dashboard_refuses_the_network_without_a_token(cli: Cli) -> None:
    env = {k: v for k, v in cli.env.items() if k != "LOCKWARDEN_DASHBOARD_TOKEN"}
    result = cli("dashboard", "--host", "0.0.0.0", "--port", "0", env=env)
    assert result.status == 64 and "token" in result.err
