"""A SQLite store shared by several Unix users of one host, and stores they may not use.

Real users, made for each test with ``groupadd``/``useradd`` and removed
after it: two users in one group, each running the command line as itself.
Skipped unless the tests run as root. The interpreter may live where only
root can read (a pyenv under /root), so each command starts as root, imports
what the command line may import, and only then becomes the user (`AS_USER`).
The directories are made under /tmp, which the users can reach (pytest's own
are private to root).
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.conftest import LOCKWARDEN, Result

SHARING = 'docs/operators.md, "A store shared by several users of one host"'


AS_USER = """
import os, pkgutil, sys, importlib
import asyncio, ctypes, grp, hashlib, json, logging, pwd, urllib.parse  # imported on demand
import lockwarden
for module in pkgutil.walk_packages(lockwarden.__path__, "lockwarden."):
    try:
        importlib.import_module(module.name)
    except ImportError:  # an extra this environment lacks
        pass
uid, gid, group, umask = map(int, sys.argv[1].split(":"))
os.setgroups([group])
os.setgid(gid)
os.setuid(uid)
os.umask(umask)
sys.argv = ["lockwarden", *sys.argv[2:]]
from lockwarden.cli.main import executable
executable()
"""
"""Runs the command line as another user: ``-c AS_USER UID:GID:GROUP:UMASK ARGS...``."""


@dataclass
class Users:
    """Two throwaway users, ``names[0]`` and ``names[1]``, both in ``group``."""

    group: str
    names: list[str]
    home: Path

    @property
    def gid(self) -> int:
        return grp.getgrnam(self.group).gr_gid

    def argv(self, who: int, *args: str, umask: int = 0o002) -> list[str]:
        """The command that runs ``lockwarden args...`` as user ``names[who]``, with its
        groups and ``umask``."""
        account = pwd.getpwnam(self.names[who])
        ids = f"{account.pw_uid}:{account.pw_gid}:{self.gid}:{umask}"
        return [sys.executable, "-c", AS_USER, ids, *args]

    def run(
        self, who: int, *args: str, umask: int = 0o002, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(who, *args, umask=umask),
            env=self.env(),
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def env(self) -> dict[str, str]:
        kept = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH")}
        return {**kept, "HOME": str(self.home)}

    def result(self, who: int, *args: str, umask: int = 0o002) -> Result:
        done = self.run(who, *args, umask=umask)
        return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def users() -> Iterator[Users]:
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("groupadd") is None:
        pytest.skip("needs root, useradd and groupadd to make throwaway users")
    tag = secrets.token_hex(3)
    group, names = f"lwg{tag}", [f"lwa{tag}", f"lwb{tag}"]
    home = Path(tempfile.mkdtemp(prefix="lw-users-", dir="/tmp"))
    home.chmod(0o1777)
    made: list[str] = []
    try:
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        for name in names:
            subprocess.run(
                ["useradd", "-M", "-U", "-G", group, "-s", "/usr/sbin/nologin", name],
                check=True,
                capture_output=True,
            )
            made.append(name)
        yield Users(group, names, home)
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)
            subprocess.run(["groupdel", name], check=False, capture_output=True)  # if left
        subprocess.run(["groupdel", group], check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def directory() -> Iterator[Path]:
    """A directory for a store, under /tmp (reachable by the throwaway users)."""
    path = Path(tempfile.mkdtemp(prefix="lw-store-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def line(result: Result) -> str:
    assert result.status == 69, result
    return result.error_line()


def test_users_of_one_group_share_a_store_in_a_setgid_directory(
    users: Users, directory: Path
) -> None:
    """Under umask 002 the files are 0664 and the directory's group: the second user runs,
    looks and queues behind the first (every file was 0600: 'Permission denied')."""
    os.chown(directory, 0, users.gid)
    directory.chmod(0o2775)
    db = f"--db={directory / 'locks.db'}"
    shown = "stat -c '%a %G' locks.db locks.db-wal locks.db-shm locks.db-writer"
    first = users.run(0, "run", db, "job", "--", "sh", "-c", f"cd '{directory}' && {shown}")
    assert first.returncode == 0, first
    assert first.stdout.splitlines() == [f"664 {users.group}"] * 4
    second = users.run(1, "run", db, "job", "--", "true")
    assert second.returncode == 0, second
    # Both at once: the second waits for the first's lock, and gets it.
    holding = directory / "holding"
    first_run = subprocess.Popen(
        users.argv(0, "run", db, "job", "--", "sh", "-c", f"touch '{holding}'; sleep 1"),
        env=users.env(),
        cwd=users.home,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not holding.exists():
            assert first_run.poll() is None, first_run.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        looked = users.run(1, "status", db, "--json")
        assert looked.returncode == 0 and '"name": "job"' in looked.stdout, looked
        waited = users.run(1, "run", db, "--wait", "30", "job", "--", "true")
        assert waited.returncode == 0, waited
    finally:
        assert first_run.wait(timeout=30) == 0, first_run.communicate()


def test_a_store_file_made_0666_beforehand_serves_a_second_user(
    users: Users, directory: Path
) -> None:
    """The first user (umask 022) made the -writer file 0600, and the second got
    'Permission denied: .../locks.db-writer': it now gets the database file's mode."""
    directory.chmod(0o777)
    path = directory / "locks.db"
    path.touch()
    path.chmod(0o666)
    db = f"--db={path}"
    assert users.run(0, "run", db, "job", "--", "true", umask=0o022).returncode == 0
    assert oct((directory / "locks.db-writer").stat().st_mode & 0o777) == "0o666"
    second = users.run(1, "run", db, "job", "--", "true", umask=0o022)
    assert second.returncode == 0, second


def test_a_store_of_roots_says_which_file_and_which_right(users: Users, directory: Path) -> None:
    """Every command writes; a user who may not is told which file and which right is
    missing, and what to do (it was 'unable to open database file', or 'attempt to write
    a readonly database')."""
    directory.chmod(0o755)
    path = directory / "locks.db"
    made = subprocess.run(
        [str(LOCKWARDEN), "init", f"--db={path}"], umask=0o022, capture_output=True, check=False
    )
    assert made.returncode == 0, made
    said = line(users.result(0, "status", f"--db={path}"))
    assert f"no write permission on {path} (the database file; owner root, group root" in said
    assert "mode 0644" in said and SHARING in said

    path.chmod(0o600)
    said = line(users.result(0, "status", f"--db={path}"))
    assert f"no read or write permission on {path} (the database file;" in said

    new = directory / "new.db"
    said = line(users.result(0, "run", f"--db={new}", "job", "--", "true"))
    assert f"cannot create {new} (the database file): no permission to create files in" in said
    assert f"{directory} (owner root, group root, mode 0755)" in said
    assert not new.exists()

    # A -writer file made 0600 by an older lockwarden, beside a database all may write.
    directory.chmod(0o777)
    path.chmod(0o666)
    (directory / "locks.db-writer").chmod(0o600)
    said = line(users.result(0, "status", f"--db={path}"))
    assert f"no read permission on {path}-writer (the writers' lock file; owner root" in said


def test_status_on_read_only_media_says_which_file_and_why(tmp_path: Path) -> None:
    """A read-only mount: the store cannot be used (every command writes), and the line
    says so, naming the file (it was 'unable to open database file')."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a read-only copy of a directory")
    source, mounted = tmp_path / "source", tmp_path / "ro"
    source.mkdir()
    mounted.mkdir()
    path = source / "locks.db"
    made = subprocess.run(
        [str(LOCKWARDEN), "init", f"--db={path}"], capture_output=True, check=False
    )
    assert made.returncode == 0, made
    bound = subprocess.run(
        ["mount", "--bind", str(source), str(mounted)], capture_output=True, check=False
    )
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr!r}")
    try:
        ro = subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(mounted)], capture_output=True, check=False
        )
        if ro.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {ro.stderr!r}")
        env = {**os.environ, "HOME": str(tmp_path)}
        env.pop("LOCKWARDEN_DB", None)
        done = subprocess.run(
            [str(LOCKWARDEN), "status", f"--db={mounted / 'locks.db'}"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        said = line(Result(done.returncode, done.stdout, done.stderr))
        assert f"{mounted / 'locks.db'} is on a read-only file system" in said
        assert "every command writes to the store (status too" in said
    finally:
        subprocess.run(["umount", str(mounted)], check=False)
