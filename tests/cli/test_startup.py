"""Start-up: what `lockwarden --version` and `lockwarden run` import (never how long it takes).

A shell script pays the command's start-up on every call; bench/cli_startup.py
measures it. What can be tested without timing is its cause: the modules a
command imports. ``-X importtime`` does not see ``importlib.import_module``,
so the probe reads ``sys.modules`` after the command has run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
from lockwarden.cli.main import main
try:
    status = main(sys.argv[2:])
except SystemExit as exc:
    status = exc.code
with open(sys.argv[1], "w") as out:
    json.dump({"status": status, "modules": sorted(sys.modules)}, out)
"""

HEAVY = ("asyncio", "rich", "psycopg", "psycopg_pool", "lockwarden.store.aio")
"""Never imported by `--version`, nor by `run` on SQLite."""

SLOW = ("dataclasses", "inspect", "logging", "secrets", "hashlib", "platformdirs", "urllib.parse")
"""Standard modules that cost a start milliseconds each, and that `run` on SQLite needs
none of: its records are NamedTuples, its ids come from os.urandom, logging is imported
only when something is logged (`hooks.logger`), the default store's directory is found
by `cli.common.state_directory`, and only other backends' URLs are split by urllib."""


def imported(tmp_path: Path, *argv: str) -> set[str]:
    report = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", PROBE, str(report), *argv],
        check=True,
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path)},
        timeout=60,
    )
    found = json.loads(report.read_text())
    assert found["status"] == 0, found["status"]
    return set(found["modules"])


def heavy(modules: set[str]) -> set[str]:
    postgres = "lockwarden.store.backends.postgresql.backend"
    return {m for m in modules if m == postgres or m.startswith(HEAVY)}


def test_version_imports_neither_the_store_nor_its_drivers(tmp_path: Path) -> None:
    modules = imported(tmp_path, "--version")
    assert "lockwarden.cli.main" in modules  # the probe sees what it should
    assert not {m for m in modules if m.startswith(("lockwarden.store", "sqlite3"))}
    assert not heavy(modules)
    assert not modules.intersection(SLOW)


@pytest.mark.parametrize("command", [["completion", "bash"], ["manpage"]])
def test_commands_that_describe_lockwarden_open_no_store(
    tmp_path: Path, command: list[str]
) -> None:
    modules = imported(tmp_path, *command)
    assert not {m for m in modules if m.startswith("lockwarden.store")}


def test_run_on_sqlite_imports_no_asyncio_rich_or_postgresql(tmp_path: Path) -> None:
    modules = imported(tmp_path, "--db", f"sqlite:///{tmp_path}/locks.db", "run", "x", "--", "true")
    assert "lockwarden.store.backends.sqlite.backend" in modules
    assert not heavy(modules)
    assert not modules.intersection(SLOW)


def test_run_on_the_default_store_imports_none_of_the_slow_modules(tmp_path: Path) -> None:
    modules = imported(tmp_path, "run", "x", "--", "true")  # the state directory's store
    assert (tmp_path / "lockwarden" / "locks.db").exists()  # the probe used it
    assert not modules.intersection(SLOW)


def test_the_quick_exit_runs_the_exit_handlers_and_flushes_what_was_printed(
    tmp_path: Path,
) -> None:
    """`executable` skips the interpreter's teardown, not what an exit must do."""
    script = (
        "import atexit, sys\n"
        "from lockwarden.cli.main import executable\n"
        "atexit.register(lambda: print('handler ran'))\n"
        "print('buffered', end=' ')\n"
        f"sys.argv = ['lockwarden', '--db', 'sqlite:///{tmp_path}/locks.db', 'run', 'x', '--',"
        " 'sh', '-c', 'exit 3']\n"
        "executable()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (3, "buffered handler ran\n")
