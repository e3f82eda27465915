"""The documentation: it builds without a warning, its Python runs as written, its links resolve."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import lockwarden

ROOT = Path(__file__).resolve().parent.parent
GUIDES = sorted((ROOT / "docs").glob("*.md"))
BLOCKS = [
    pytest.param(code, id=f"{path.name}:{n}")
    for path in GUIDES
    for n, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.DOTALL))
]


@pytest.mark.slow
def test_the_site_and_api_reference_build_with_warnings_as_errors(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    assert mkdocs is not None, "pip install -e '.[docs]'"
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    reference = (tmp_path / "site" / "api" / "store" / "index.html").read_text()
    for documented in ("lockwarden.store.Session.renew", "lockwarden.store.SharedLock"):
        assert f'id="{documented}"' in reference


def test_the_guides_have_python_to_run() -> None:
    assert BLOCKS, "no python examples found in docs/"


@pytest.mark.parametrize("code", BLOCKS)
def test_a_python_block_of_the_guides_runs_as_written(code: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_readme_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)\)", readme)
    local = [t for t in targets if "://" not in t]
    assert "docs/operators.md" in local and "LICENSE" in local
    for target in local:
        assert (ROOT / target).exists(), target


def test_the_license_is_the_one_pyproject_names() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


def test_session_ids_are_as_long_as_the_cli_reference_says(tmp_path: Path) -> None:
    """docs/cli.md gave them as 32 hex digits; a SQL store's have 48 (an etcd store's 32)."""
    reference = (ROOT / "docs" / "cli.md").read_text()
    assert "| the holder's session: 48 hex digits (" in reference
    assert "32 hex" not in reference
    shown = re.findall(r'"session_id": "([0-9a-f]*)"', reference)
    assert shown and all(len(s) == 48 for s in shown)
    with lockwarden.connect(str(tmp_path / "locks.db")) as store, store.session("a") as s:
        assert re.fullmatch(r"[0-9a-f]{48}", s.id)
