"""status, break, clean, permits, init: the real executable, on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lockwarden import LockLost
from lockwarden.store import Store
from tests.cli.conftest import LOCKWARDEN, Cli, hold
from tests.conftest import wait_for

LOCK_FIELDS = {
    "name",
    "mode",
    "token",
    "session_id",
    "app_id",
    "host",
    "pid",
    "held_for",
    "heartbeat_age",
    "stale",
    "waiters",
}
WAITER_FIELDS = {
    "name",
    "mode",
    "session_id",
    "app_id",
    "host",
    "pid",
    "waited_for",
    "expires_in",
    "stale",
}


def test_status_shows_holders_and_waiters_in_both_forms(cli: Cli) -> None:
    assert cli("status").out.startswith("no locks held in ")
    holder = hold(cli, "reports/nightly", "--app", "etl")
    reader = hold(cli, "reports/weekly", "--read")
    waiter = cli.start("run", "--wait", "30", "reports/nightly", "--", "true")
    wait_for(lambda: cli.status()["waiters"], what="the waiter to queue")
    hold(cli, "other")

    shape = cli.status()
    assert set(shape) == {"format", "database", "locks", "waiters"}
    assert shape["format"] == 1 and shape["database"] == cli.url
    assert [e["name"] for e in shape["locks"]] == ["other", "reports/nightly", "reports/weekly"]
    nightly = shape["locks"][1]
    assert set(nightly) == LOCK_FIELDS
    assert nightly["mode"] == "write" and shape["locks"][2]["mode"] == "read"
    assert (nightly["app_id"], nightly["host"], nightly["pid"]) == (
        "etl",
        os.uname().nodename,
        holder.run.pid,
    )
    assert 0 <= nightly["held_for"] < 30 and 0 <= nightly["heartbeat_age"] < 15
    assert (nightly["stale"], nightly["waiters"], shape["locks"][2]["waiters"]) == (False, 1, 0)
    [queued] = shape["waiters"]
    assert set(queued) == WAITER_FIELDS
    assert (queued["name"], queued["pid"], queued["stale"]) == (
        "reports/nightly",
        waiter.pid,
        False,
    )
    assert 0 < queued["expires_in"] <= 30 and queued["waited_for"] >= 0

    prefixed = cli("status", "reports/", "--json")
    assert '"other"' not in prefixed.out and '"reports/weekly"' in prefixed.out

    table = cli("status", "reports/")
    assert table.status == 0 and "other" not in table.out
    row = next(line for line in table.out.splitlines() if "reports/nightly" in line)
    cells = [cell.strip() for cell in re.split("[│|]", row)[1:-1]]  # box drawing, or ASCII
    assert cells[:6] == [
        "reports/nightly",
        "write",
        str(nightly["token"]),
        "etl",
        os.uname().nodename,
        str(holder.run.pid),
    ]
    assert cells[8:] == ["live", "1"]  # not stale, one waiter
    assert str(reader.run.pid) in table.out and str(waiter.pid) in table.out
    assert "STALE" not in table.out


def test_break_asks_first_and_fences_off_the_holder(cli: Cli, store: Store) -> None:
    with store.session(app_id="stuck") as session:
        lock = session.lock("job")
        refused = cli("break", "job")  # no terminal, no --yes
        assert refused.status == 64 and "add --yes" in refused.error_line()
        assert answer_prompt(cli, "n\n") == 1
        lock.check()  # still held

        assert answer_prompt(cli, "y\n") == 0
        with pytest.raises(LockLost):
            lock.check()
        run = cli("run", "job", "--", "sh", "-c", "echo $LOCKWARDEN_TOKEN")
        assert int(run.out) > lock.token

    nothing = cli("break", "--yes", "job")
    assert (nothing.status, nothing.out) == (0, "'job' is not held: nothing to break\n")


def test_verbose_shows_the_override_as_the_store_logs_it(cli: Cli, store: Store) -> None:
    with store.session(app_id="stuck") as session:
        held = session.lock("job")
        quiet = cli("break", "--yes", "job")
        assert quiet.status == 0 and quiet.err == ""  # INFO records only with --verbose
        assert not held.owned()  # the holder learns it is gone, and takes it again
        session.lock("job")
        loud = cli("--verbose", "break", "--yes", "job")
    # The store's admin log record, set up for the command line on its first record.
    assert loud.status == 0
    assert re.search(r"^lockwarden: break_lock 'job' on \S+: ", loud.err, re.M), loud.err


def answer_prompt(cli: Cli, answer: str) -> int:
    """Run ``lockwarden break job`` on a terminal and type ``answer``; its exit status."""
    main, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [str(LOCKWARDEN), "break", "job"],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            env=cli.env,
        )
        seen = b""
        deadline = time.monotonic() + 30
        while b"[y/N]" not in seen:
            assert proc.poll() is None and time.monotonic() < deadline, seen
            if select.select([main], [], [], 0.1)[0]:
                seen += os.read(main, 1024)
        assert b"'job' is held (write) by app 'stuck'" in seen
        os.write(main, answer.encode())
        return proc.wait(timeout=30)
    finally:
        os.close(main)
        os.close(terminal)


@pytest.mark.slow
def test_clean_counts_what_it_removes(cli: Cli) -> None:
    holder = hold(cli, "job", "--ttl", "1")
    waiter = cli.start("run", "--ttl", "1", "--wait", "60", "job", "--", "true")
    wait_for(lambda: cli.status()["waiters"], what="the waiter to queue")
    for dead in (holder.run, waiter):
        os.kill(dead.pid, signal.SIGKILL)

    def all_stale() -> bool:
        shape = cli.status()
        return all(e["stale"] for e in shape["locks"] + shape["waiters"])

    wait_for(all_stale, what="both TTLs to pass")
    cleaned = cli("clean")
    # etcd removes a dead session's key and queue entries itself when its lease ends:
    # what is left for clean is the lock (and so the session it names).
    expected = (
        "removed 1 expired session, 1 lock they held and 0 dead waiters\n"
        if cli.url.startswith("etcd:")
        else "removed 2 expired sessions, 1 lock they held and 1 dead waiter\n"
    )
    assert (cleaned.status, cleaned.out) == (0, expected)
    assert cli.status() == {**cli.status(), "locks": [], "waiters": []}
    again = cli("clean")
    assert again.out == "removed 0 expired sessions, 0 locks they held and 0 dead waiters\n"


def test_permits_show_set_and_take_effect(cli: Cli, store: Store) -> None:
    def permits(*options: str) -> str:
        result = cli("permits", "job", *options)
        assert result.status == 0, result
        return result.out

    assert permits() == "'job': read unlimited, write 1\n"
    assert permits("--write", "2") == "'job': read unlimited, write 2\n"
    assert permits("--read", "3") == "'job': read 3, write 2\n"  # --write kept its value
    with store.session(app_id="first") as session:
        session.lock("job")
        assert cli("run", "job", "--", "true").status == 0  # the second of two permits
        assert permits("--write", "1") == "'job': read 3, write 1\n"
        assert cli("run", "job", "--", "true").status == 75
    assert permits("--read", "unlimited") == "'job': read unlimited, write 1\n"


def test_raising_permits_beside_a_holder_must_be_forced_and_confirmed(
    cli: Cli, store: Store
) -> None:
    with store.session(app_id="first") as session, session.lock("job"):
        refused = cli("permits", "job", "--write", "2", "--force")
        assert refused.status == 64 and "add --yes" in refused.error_line()
        forced = cli("permits", "job", "--write", "2", "--force", "--yes")
        assert forced.status == 0 and forced.out == "'job': read unlimited, write 2\n"
        assert cli("run", "job", "--", "true").status == 0
    [record] = store.admin_log()
    assert (record.action, record.subject) == ("set_permits", "job")


def test_init_says_where_the_database_is_without_the_password(cli: Cli) -> None:
    url = cli.url.replace("postgres@", "postgres:s3cret@")  # trust auth ignores it
    for args in (["init", "--db", url], ["--db", url, "init"]):  # before or after the command
        result = cli(*args, env={**cli.env, "LOCKWARDEN_DB": "nosuch://"})
        assert (result.status, result.err) == (0, "")
        assert result.out == f"lock store ready: {cli.url}\n"


def test_the_default_database_is_created_in_the_state_directory(cli: Cli, tmp_path: Path) -> None:
    env = {**cli.env, "LOCKWARDEN_DB": "", "XDG_STATE_HOME": str(tmp_path / "fresh" / "state")}
    database = tmp_path / "fresh" / "state" / "lockwarden" / "locks.db"
    result = cli("init", env=env)  # an empty $LOCKWARDEN_DB counts as unset
    assert result.out == f"lock store ready: sqlite:///{database}\n"
    assert database.exists()
    env["XDG_STATE_HOME"] = "relative/state"  # not absolute: ignored, as the XDG rule says
    home_database = Path(cli.env["HOME"]) / ".local" / "state" / "lockwarden" / "locks.db"
    assert cli("init", env=env).out == f"lock store ready: sqlite:///{home_database}\n"
    env["LOCKWARDEN_DB"] = cli.url  # wins over the default (and --db over both)
    assert cli("init", env=env).out == f"lock store ready: {cli.url}\n"
