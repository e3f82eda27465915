"""The fencing example runs as its docstring says, on both backends."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

from tests.conftest import PG, pg_admin

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fencing.py"


def run(*args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stdout
    return result.stdout.splitlines()


def test_the_fence_turns_away_the_frozen_holders_write_on_sqlite() -> None:
    check(run())


def test_the_fence_turns_away_the_frozen_holders_write_on_postgres() -> None:
    schema = f"lw_test_{secrets.token_hex(4)}"
    try:
        check(run(f"{PG}?schema={schema}"))
    finally:
        with pg_admin() as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def check(lines: list[str]) -> None:
    assert lines[0].startswith("slow: holding 'account' with token ")
    slow_token = int(lines[0].split("token ")[1].split(",")[0])
    assert lines[1] == "slow: frozen before its write"
    fast_token = int(lines[2].split("token ")[1].split(":")[0])
    assert fast_token > slow_token
    assert lines[2].endswith(": 100 -> 110")
    assert lines[3].startswith("slow: write refused: ")
    assert lines[4:] == ["balance: 110"]
