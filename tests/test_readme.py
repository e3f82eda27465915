"""The README's promises: its example runs as written, and CI runs its test command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_python_quick_start_runs_as_written() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    assert blocks, "README has no python example"
    for block in blocks:
        result = subprocess.run(
            [sys.executable, "-c", block], check=False, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert "could not get lock S on ('orders', 42)" in result.stdout
        assert result.stdout.rstrip().endswith("[]")


def test_ci_runs_the_readme_test_command() -> None:
    command = re.search(r"pip install -e '\.\[test\]' && (python -m pytest)", README)
    assert command is not None, "README must show the test command"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(command.group(1))}$", ci, flags=re.MULTILINE)
