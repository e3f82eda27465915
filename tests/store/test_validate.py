"""Bad input: a typed error saying what to do, raised before anything is stored."""

from __future__ import annotations

import math
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lockwarden import LockUsageError, NotHeld
from lockwarden.store import Session, Store, validate
from tests.conftest import Background, wait_for

LONG = "é" * 256 + "x"  # 513 bytes of UTF-8, 257 characters


def _state(store: Store) -> tuple[object, ...]:
    return (
        [(e.name, e.mode, e.token, e.holder.session_id) for e in store.locks()],
        [(w.name, w.session_id) for w in store.waiters()],
        store.permits("held"),
    )


BAD_CALLS: list[tuple[str, Callable[[Store, Session], Any], str]] = [
    ("empty name", lambda st, s: s.lock(""), "must not be empty"),
    ("513-byte name", lambda st, s: s.lock(LONG), "513 bytes"),
    ("name not text", lambda st, s: s.lock(b"x"), "must be a string"),
    ("NUL in name", lambda st, s: s.lock("a\x00b"), "NUL"),
    ("unknown mode", lambda st, s: s.lock("held", mode="rw"), "unknown lock mode"),
    ("intention mode", lambda st, s: s.lock("held", mode="IX"), "'read' and 'write'"),
    ("negative timeout", lambda st, s: s.lock("held", timeout=-1), "timeout must be"),
    ("NaN timeout", lambda st, s: s.lock("held", timeout=float("nan")), "timeout must be"),
    ("infinite timeout", lambda st, s: s.lock("held", timeout=float("inf")), "use None"),
    ("timeout not a number", lambda st, s: s.lock("held", timeout="5"), "timeout must be"),
    ("bad stale policy", lambda st, s: s.lock("held", on_stale="steal"), "on_stale"),
    ("empty multi-lock", lambda st, s: s.lock_many([]), "at least one"),
    ("name twice", lambda st, s: s.lock_many([("a", "read"), ("a", "write")]), "twice"),
    ("not pairs", lambda st, s: s.lock_many(["ab"]), "pair"),
    ("multi-lock bad name", lambda st, s: s.try_lock_many([("ok", "read"), ("", "read")]), "empty"),
    ("read permits 0", lambda st, s: st.set_permits("held", read=0), "permits must be"),
    ("write permits 0", lambda st, s: st.set_permits("held", write=0), "permits must be"),
    ("write permits None", lambda st, s: st.set_permits("held", write=None), "permits must be"),
    ("permits a bool", lambda st, s: st.set_permits("held", read=True), "permits must be"),
    # Found by the fuzz: past BIGINT, SQLite raised OverflowError and PostgreSQL a StoreError.
    ("read permits 2**63", lambda st, s: st.set_permits("held", read=2**63), "2\\*\\*63 - 1"),
    ("write permits 2**70", lambda st, s: st.set_permits("held", write=2**70), "2\\*\\*63 - 1"),
    ("ttl 0", lambda st, s: st.session(app_id="x", ttl=0), "ttl must be"),
    ("ttl NaN", lambda st, s: st.session(app_id="x", ttl=float("nan")), "ttl must be"),
    ("empty app id", lambda st, s: st.session(app_id=""), "app_id"),
    ("empty name to break", lambda st, s: st.break_lock(""), "must not be empty"),
    ("fence token negative", lambda st, s: st.fence("f").write(-1, "v"), "token"),
    ("fence token 2**63", lambda st, s: st.fence("f").read(2**63), "2\\*\\*63 - 1"),
    ("fence value not text", lambda st, s: st.fence("f").write(1, b"v"), "text"),
    ("fence resource empty", lambda st, s: st.fence(""), "must not be empty"),
    ("lone surrogate in name", lambda st, s: s.lock("a\ud800"), "not valid Unicode"),
    ("lone surrogate app id", lambda st, s: st.session(app_id="\udfff"), "not valid Unicode"),
    ("NUL in fence value", lambda st, s: st.fence("f").write(1, "a\x00"), "NUL"),
    ("surrogate fence value", lambda st, s: st.fence("f").write(1, "\ud800"), "not valid Unicode"),
    ("token of 20,000 digits", lambda st, s: st.fence("f").write(10**20000, "v"), "bits"),
    ("permits of 2**20000", lambda st, s: st.set_permits("held", write=2**20000), "bits"),
    ("admin log limit", lambda st, s: st.admin_log(0), "limit must be"),
    (
        "raise timeout NaN",
        lambda st, s: st.set_permits("held", write=2, timeout=math.nan),
        "timeout",
    ),
]


@pytest.mark.parametrize(
    ("call", "message"), [(c, m) for _, c, m in BAD_CALLS], ids=[i for i, _, _ in BAD_CALLS]
)
def test_bad_input_is_refused_and_nothing_changes(
    store: Store, call: Callable[[Store, Session], Any], message: str
) -> None:
    with store.session(app_id="a") as s, store.session(app_id="b") as other:
        s.lock("held")
        other.try_lock("held")  # busy: stays as it is
        store.set_permits("held", read=3)
        before = _state(store)
        with pytest.raises(LockUsageError, match=message):
            call(store, s)
        assert _state(store) == before


def test_a_stamp_of_another_session_is_refused(store: Store) -> None:
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        stamp = a.lock_many([("s1", "read"), ("s2", "write")])
        before = _state(store)
        with pytest.raises(NotHeld, match="another session"):
            b.release(stamp)
        with pytest.raises(NotHeld, match="expected a Stamp"):
            b.release("not a stamp")  # type: ignore[arg-type]
        assert _state(store) == before


@pytest.mark.parametrize("huge", [2**1100, 1e308, 10**400])
def test_waits_beyond_what_a_thread_can_wait_are_clamped(store: Store, huge: float) -> None:
    """Integers beyond float range were OverflowError; now every duration is clamped."""
    with store.session(app_id="a") as s, s.lock("free", timeout=huge) as held:
        assert held.token > 0


@pytest.mark.parametrize("ttl", [86400.001, 2**1100, 1e308, 10**400])
def test_a_lease_longer_than_a_day_is_refused(store: Store, ttl: float) -> None:
    """A crashed holder's locks would stay with it, for waiters elsewhere, for that long."""
    with pytest.raises(LockUsageError, match=r"ttl must be at most 86400 s \(one day\)"):
        store.session(app_id="a", ttl=ttl)
    with store.session(app_id="a", ttl=validate.MAX_TTL) as s:
        assert s.ttl == 86400


def test_a_holder_with_the_longest_ttl_does_not_crash_its_waiters(store: Store) -> None:
    """Its staleness deadline is a day away: the waiter must wait for a release, not fail."""
    holder = store.session(app_id="forever", ttl=validate.MAX_TTL)
    held = holder.lock("job")
    with store.session(app_id="waiter") as s:
        waiting = Background(lambda: s.lock("job"))
        wait_for(lambda: store.waiters("job"), what="the waiter to queue")
        held.release()
        waiting.result().release()
    holder.close()


MODES = """
import os, stat, sys, lockwarden
path = sys.argv[1]
def mode(suffix): return stat.S_IMODE(os.stat(path + suffix).st_mode)
with lockwarden.connect(path) as store, store.session("a") as s, s.lock("x"):
    print(" ".join(f"{mode(x):04o}" for x in ("", "-wal", "-shm", "-writer")))
"""
"""Prints the modes of the store's four files while it is open (-wal and -shm go at close)."""


def _modes(path: Path, umask: int) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", MODES, str(path)],
        umask=umask,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize(("umask", "mode"), [(0o022, "0644"), (0o002, "0664"), (0o077, "0600")])
def test_a_new_store_file_follows_the_umask(tmp_path: Path, umask: int, mode: str) -> None:
    """As any program's files: a store that several users share is made with their umask
    (it was always 0600, and a second user could not open it)."""
    assert _modes(tmp_path / "locks.db", umask) == [mode] * 4


def test_the_files_beside_a_store_get_the_database_files_mode(tmp_path: Path) -> None:
    """A file made beforehand with the mode wanted decides for the -wal, -shm (SQLite) and
    -writer files, whatever the umask of whoever opens it first (the -writer file was 0600)."""
    path = tmp_path / "locks.db"
    path.touch()
    path.chmod(0o666)
    assert _modes(path, 0o077) == ["0666"] * 4


def test_the_default_store_is_private_in_a_private_directory(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if k != "LOCKWARDEN_DB"},
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    lockwarden_cli = Path(sys.executable).with_name("lockwarden")
    directory = tmp_path / "state" / "lockwarden"
    shown = "stat -c %a locks.db locks.db-wal locks.db-shm locks.db-writer"
    done = subprocess.run(
        [str(lockwarden_cli), "run", "x", "--", "sh", "-c", f"cd '{directory}' && {shown}"],
        env=env,
        umask=0o002,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done
    assert done.stdout.split() == ["600"] * 4
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "locks.db").stat().st_mode) == 0o600
