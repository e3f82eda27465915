"""Where the store is: commands that only look never create one; `init --check` changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lockwarden
from lockwarden.store import check_schema
from lockwarden.store.backends.sql import schema
from tests.cli.conftest import Cli

READ_ONLY = [
    ["status"],
    ["status", "--json"],
    ["break", "--yes", "job"],
    ["permits", "job"],
    ["permits", "job", "--write", "2"],
    ["clean"],
]


@pytest.fixture
def url(sql_url: str) -> str:
    """Missing stores and schema versions are the SQL backends' (an etcd store has no tables)."""
    return sql_url


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_commands_that_only_look_never_create_a_store(
    url: str, tmp_path: Path, args: list[str]
) -> None:
    """A mistyped path or schema is reported, not silently made into an empty store."""
    cli = Cli(url, tmp_path)
    result = cli(*args)
    assert result.status == 69, result
    line = result.error_line()
    assert f"no lock store at {check_schema(url).url}" in line
    assert "(create it with `lockwarden init`)" in line
    assert check_schema(url).found is None  # still nothing there
    assert not list(tmp_path.glob("locks.db*"))


def test_a_plain_sqlite_file_without_our_tables_is_not_a_store(tmp_path: Path) -> None:
    import sqlite3  # noqa: PLC0415

    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    result = Cli(f"sqlite:///{other}", tmp_path)("status")
    assert result.status == 69 and "no lock store at" in result.error_line()


def test_init_check_on_a_missing_store_says_it_would_create_it_and_creates_nothing(
    url: str, tmp_path: Path
) -> None:
    """A few lines, not every historical step ending in an empty "step to version 9:";
    --json keeps every statement for scripts."""
    cli = Cli(url, tmp_path)
    result = cli("init", "--check")
    assert result.status == 0, result
    assert result.out.splitlines() == [
        f"no lock store at {check_schema(url).url}",
        f"this lockwarden has schema version {schema.SCHEMA_VERSION}",
        "init (or any command that takes a lock) would create it at schema version "
        f"{schema.SCHEMA_VERSION}, in one transaction (--json lists the statements)",
    ]
    shape = json.loads(cli("init", "--check", "--json").out)
    assert shape["found"] is None
    assert [step["version"] for step in shape["steps"]] == list(range(1, schema.SCHEMA_VERSION + 1))
    assert any("CREATE TABLE" in sql for sql in shape["steps"][0]["statements"])
    assert check_schema(url).found is None
    assert cli("init").status == 0  # and init does what it said
    assert "nothing to do" in cli("init", "--check").out


def test_init_check_says_a_step_without_statements_moves_the_version_only(
    url: str, tmp_path: Path
) -> None:
    """Version 9 has no statement of its own (it ended the output with "step to version 9:")."""
    with lockwarden.connect(url) as store:
        store._backend.query(schema.WRITE_VERSION, {"version": 8}, write=True)
    result = Cli(url, tmp_path)("init", "--check")
    assert result.status == 0, result
    assert "  step to version 9: the version number only (no statement)" in result.out.splitlines()
    assert not result.out.rstrip().endswith(":")


def test_init_check_says_when_this_lockwarden_cannot_use_the_store(
    url: str, tmp_path: Path
) -> None:
    with lockwarden.connect(url) as store:
        newer = schema.SCHEMA_VERSION + 1
        store._backend.query(schema.WRITE_VERSION, {"version": newer}, write=True)
        store._backend.query(schema.WRITE_COMPATIBLE_FROM, {"compatible_from": newer}, write=True)
    cli = Cli(url, tmp_path)
    result = cli("init", "--check", "--json")
    assert result.status == 69
    shape = json.loads(result.out)
    assert (shape["found"], shape["usable_from"], shape["usable"]) == (newer, newer, False)
    assert shape["this_version"] == schema.SCHEMA_VERSION and shape["steps"] == []
    refused = cli("run", "job", "--", "true")
    assert refused.status == 69 and "upgrade lockwarden on this host" in refused.error_line()
