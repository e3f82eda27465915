"""Every bad input is one line on stderr and a documented exit status, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

import lockwarden
from lockwarden.cli import admin, main
from tests.cli.conftest import Cli


@pytest.fixture
def offline(tmp_path: Path) -> Cli:
    """For what never reaches a database: --help and --version (once, not per backend)."""
    return Cli("nosuch://", tmp_path)


PARSE_ERRORS = [
    ([], "the following arguments are required: COMMAND"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["status", "--bogus"], "unrecognized arguments: --bogus"),
    (["run", "job"], "missing the command after --"),
    (["run", "job", "--"], "missing the command after --"),
    (["run", "job", "sleep", "1"], "the command goes after --"),
    (["run", "--read", "--write", "job", "--", "true"], "not allowed with argument --read"),
    (["run", "--wait", "soon", "job", "--", "true"], "--wait: 'soon' is not a number of seconds"),
    (["run", "--wait", "-1", "job", "--", "true"], "--wait: '-1' is not a number of seconds >= 0"),
    (["run", "--ttl", "0", "job", "--", "true"], "--ttl: '0' is not a number of seconds > 0"),
    (["run", "--ttl", "nan", "job", "--", "true"], "--ttl: 'nan' is not"),
    (["run", "--kill-after", "inf", "job", "--", "true"], "--kill-after: 'inf' is not"),
    (["run", "--conflict-exit-code", "256", "job", "--", "true"], "exit status from 0 to 255"),
    (["permits", "job", "--read", "0"], "--read: '0' is not a whole number >= 1 or 'unlimited'"),
    (["permits", "job", "--write", "many"], "--write: 'many' is not a whole number >= 1"),
    (["break", "job"], "refusing to break 'job' without confirmation"),
]
"""Refused before any database is opened, so once is enough (not once per backend)."""


@pytest.mark.parametrize(
    ("args", "message"), PARSE_ERRORS, ids=[" ".join(a)[:40] for a, _ in PARSE_ERRORS]
)
def test_bad_arguments_exit_64(offline: Cli, args: list[str], message: str) -> None:
    assert_refused(offline, args, message)


def assert_refused(cli: Cli, args: list[str], message: str) -> None:
    result = cli(*args)
    assert result.status == 64, result
    assert message in result.error_line()
    assert result.out == ""


STORE_REFUSES = [
    (["run", "", "--", "true"], "lock name must not be empty"),
    (["run", "x" * 513, "--", "true"], "the limit is 512"),
    (["run", "--app", "", "job", "--", "true"], "app_id must not be empty"),
    (["permits", "", "--write", "2"], "lock name must not be empty"),
    (["break", "--yes", "x" * 513], "the limit is 512"),
]
"""Refused by the store's own checks, after connecting: on each backend."""


@pytest.mark.parametrize(
    ("args", "message"), STORE_REFUSES, ids=[" ".join(a)[:40] for a, _ in STORE_REFUSES]
)
def test_bad_names_exit_64(cli: Cli, args: list[str], message: str) -> None:
    assert_refused(cli, args, message)
    assert cli.status()["locks"] == []


BAD_DATABASES = [
    ("mongodb://db/x", "unsupported store URL scheme 'mongodb'"),
    ("mysql://u:pw@127.0.0.1:1/x", "Can't connect"),
    ("sqlite://", "names no file"),
    ("sqlite:////no/such/directory/locks.db", "the directory /no/such/directory does not exist"),
    ("postgresql://postgres@127.0.0.1:5432/test?schema=Bad-Name", "is not a plain identifier"),
    ("postgresql://postgres:pw@127.0.0.1:1/x", "127.0.0.1:1/x: connection failed"),
]


@pytest.mark.parametrize(("url", "message"), BAD_DATABASES)
def test_an_unusable_database_exits_69(offline: Cli, url: str, message: str) -> None:
    result = offline("run", "--db", url, "job", "--", "true")
    assert result.status == 69, result
    line = result.error_line()
    assert message in line and "pw" not in line


def test_an_etcd_cluster_that_does_not_answer_is_said_without_a_dangling_colon(
    offline: Cli,
) -> None:
    """etcd3gw's exceptions carry no text: the line ended in "reachable?): "."""
    result = offline("status", "--db", "etcd://127.0.0.1:1/x", "--call-timeout", "0.3")
    assert result.status == 69, result
    line = result.error_line()
    assert "no member answered within" in line
    assert line.endswith("(is a majority of the cluster up and reachable?)"), line


def test_a_state_directory_that_cannot_be_made_exits_69(offline: Cli, tmp_path: Path) -> None:
    (tmp_path / "file").touch()
    env = {k: v for k, v in offline.env.items() if k != "LOCKWARDEN_DB"}
    result = offline("init", env={**env, "XDG_STATE_HOME": str(tmp_path / "file" / "state")})
    assert result.status == 69
    assert "cannot create the state directory" in result.error_line()


def test_a_cmd_that_cannot_run_exits_127_or_126_and_releases_the_lock(
    cli: Cli, tmp_path: Path
) -> None:
    missing = cli("run", "job", "--", "no-such-command-lockwarden")
    assert missing.status == 127
    assert "cannot run 'no-such-command-lockwarden': command not found" in missing.error_line()
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\n")
    refused = cli("run", "job", "--", str(script))
    assert refused.status == 126
    assert "permission denied" in refused.error_line()
    assert cli.status()["locks"] == []


@pytest.mark.parametrize("command", ["", *main.COMMANDS])
def test_every_command_has_help_and_version(offline: Cli, command: str) -> None:
    cli = offline
    args = [command] if command else []
    helped = cli(*args, "--help")
    assert (helped.status, helped.err) == (0, "")
    assert helped.out.startswith(f"usage: lockwarden {command}".rstrip())
    versioned = cli(*args, "--version")
    assert (versioned.status, versioned.out) == (0, f"lockwarden {lockwarden.__version__}\n")


def test_exit_statuses_are_documented_in_help(offline: Cli) -> None:
    text = offline("run", "--help").out
    for status in ("64", "69", "70", "75", "126, 127", "128+N"):
        assert f"\n  {status} " in text


def test_an_unexpected_failure_is_one_line_asking_for_a_report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def broken(*args: object) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(admin, "clean", broken)
    assert main.main(["--db", f"sqlite:///{tmp_path}/x.db", "clean"]) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "internal error: KeyError: 'surprise'" in err and "please report" in err
