"""The README's promises: its commands and examples run as written, and CI runs its test command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
QUICK_START = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
COMMANDS = re.findall(r"```\n(.*?)\n```", QUICK_START, flags=re.DOTALL)
EXAMPLES = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def run_python(code: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def example(marker: str) -> str:
    [code] = [block for block in EXAMPLES if marker in block]
    return code


def test_every_python_example_is_run_here() -> None:
    assert len(EXAMPLES) == 3


def test_the_lock_manager_example_runs_as_written(tmp_path: Path) -> None:
    out = run_python(example("LockManager()"), tmp_path)
    assert "could not get lock S on ('orders', 42)" in out
    assert out.rstrip().endswith("[]")


def test_the_store_example_runs_as_written(tmp_path: Path) -> None:
    out = run_python(example('app_id="billing"'), tmp_path)
    assert out == "holding invoices with fencing token 1\nreports got None\n[]\n"
    assert (tmp_path / "locks.db").exists()


def test_the_asyncio_example_runs_as_written(tmp_path: Path) -> None:
    """await, async with (both forms) and a cancelled waiter that leaves nothing queued."""
    code = example("asyncio.run(main())")
    assert "await session.lock_async(" in code and "async with session.lock_async(" in code
    out = run_python(code, tmp_path)
    assert out == (
        "holding invoices with fencing token 1\nwaiting: []\nholding it again with token 2\n"
    )


def test_the_first_command_installs_and_runs_lockwarden_on_the_default_store(
    tmp_path: Path,
) -> None:
    install, _, command = COMMANDS[0].rpartition(" && ")
    assert install == "python3 -m venv .venv && . .venv/bin/activate && pip install -e ."
    assert command.startswith("lockwarden run ")
    # This environment is that install, done: run the rest as written, on a
    # fresh state directory, with no database chosen.
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "LOCKWARDEN_DB"}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    result = subprocess.run(
        ["sh", "-c", command], env=env, check=False, capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "holding hello with fencing token 1\n"
    assert (tmp_path / "state" / "lockwarden" / "locks.db").exists()


def test_ci_runs_the_readme_test_command() -> None:
    command = COMMANDS[1]
    assert command == "bash tests/servers.sh && pip install -e '.[test]' && python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(command)}$", ci, flags=re.MULTILINE)


def test_the_machine_script_changes_nothing_on_a_ready_machine() -> None:
    """The servers are up and the programs installed (this run is proof): it returns at once."""
    result = subprocess.run(
        ["bash", str(ROOT / "tests" / "servers.sh")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
