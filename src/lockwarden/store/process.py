"""Which process on this machine opened a session, told apart from a later one with its pid.

A session records, beside host and pid, the process's **identity**: the
kernel's boot id, the pid namespace and the pid's start time (field 22 of
``/proc/<pid>/stat``, in clock ticks since boot). A pid is reused once its
process is gone, so the pid alone cannot say that the holder is alive; the
three together can. An acquirer whose own identity shows the same boot and
pid namespace as a holder's can therefore look at ``/proc`` and know, not
guess, that the holder is gone: then it marks that session expired at once
instead of waiting out the TTL (design note, "A holder whose process is gone").

Only Linux has all three; elsewhere (or when ``/proc`` is hidden) the identity
is None and the TTL alone judges, as for a holder on another host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from functools import cache
from typing import Any

from lockwarden.errors import LockUsageError

_GONE_STATES = frozenset("ZXx")
"""A zombie (exited, not yet reaped) or dead process no longer runs the session."""

RECHECK = 0.25
"""Seconds for which a process found alive in ``/proc`` is only asked whether its pid
still exists (``kill(pid, 0)``, one system call) instead of being read again."""

_KEPT = 1024
"""At most this many processes remembered as found alive."""

_found_alive: dict[tuple[int, str], float] = {}
"""(pid, recorded identity) -> when ``/proc`` last showed that very process alive."""


def _stat(pid: int) -> tuple[str, str] | None:
    """The state and start time of ``pid``, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 2 (the command) is in parentheses and may hold spaces or ")":
    # the fields after the last ")" start with field 3 (the state).
    rest = text.rsplit(")", 1)[1].split()
    return rest[0], rest[22 - 3]


@cache
def _boot_id() -> str | None:
    """The kernel's id of this boot, or None where it cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def boot() -> int | None:
    """This boot of this machine as a positive number (from the kernel's boot id), or None
    where it cannot be known: it changes whenever the machine starts again, as after a
    power loss."""
    found = _boot_id()
    try:
        return None if found is None else int(found.replace("-", "")[:15], 16)  # 60 bits
    except ValueError:
        return None


@cache
def machine() -> str | None:
    """This boot of this kernel, and our pid namespace: where a pid means one process (the
    start of every `identity` made here), or None where it cannot be known."""
    boot_id = _boot_id()
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return None if boot_id is None else f"{boot_id}/{namespace}"


def identity(pid: int | None = None) -> str | None:
    """The identity of process ``pid`` (default: this one), or None where it cannot be known."""
    here = machine()
    try:
        found = _stat(os.getpid() if pid is None else pid)
    except OSError:
        return None
    if here is None or found is None:
        return None
    return f"{here}/{found[1]}"


def local(row: Mapping[str, Any]) -> bool:
    """Whether the session of ``row`` (with ``pid_start``) was opened on this machine,
    in our pid namespace, where its pid can be looked up."""
    recorded = row.get("pid_start")
    here = machine()
    return recorded is not None and here is not None and recorded.startswith(here + "/")


def gone(row: Mapping[str, Any]) -> bool:
    """Whether the process that opened the session of ``row`` (``pid``, ``pid_start``)
    has certainly ended: it ran on this machine, and its pid now names no
    process, a zombie, or a process started later."""
    if not local(row):
        return False  # another host, boot or pid namespace: only the TTL can tell
    pid, recorded = int(row["pid"]), row["pid_start"]
    key = (pid, recorded)
    now = time.monotonic()
    if now - _found_alive.get(key, -RECHECK) < RECHECK:
        # Seen alive just now: a waiter looks at each process in its way on every
        # attempt (about 2.5 reads of /proc per contended acquisition, 18 µs each,
        # against 1.3 µs for this). A pid that is free again is gone at once; a
        # zombie, or a pid reused this quickly, is seen at the next full look.
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _found_alive.pop(key, None)
            return True
        except OSError:
            pass  # exists, and is another user's
        return False
    try:
        found = _stat(pid)
    except OSError:
        return False  # cannot look (permissions): take it as alive
    if found is None or found[0] in _GONE_STATES or recorded != f"{machine()}/{found[1]}":
        _found_alive.pop(key, None)
        return True
    if len(_found_alive) >= _KEPT:
        _found_alive.clear()
    _found_alive[key] = now
    return False


def forked_session(pid: int) -> LockUsageError:
    """The error for using, in a forked child, a session that process ``pid`` opened."""
    return LockUsageError(
        f"this session was opened by process {pid}, which this process was forked from: "
        "its locks are the parent's. Open a session of this process's own with "
        "store.session(...): the store serves this process too."
    )


def forked_from(pid: int) -> LockUsageError:
    """The error for using, in a forked child, a store that process ``pid`` opened."""
    return LockUsageError(
        f"this connection to the lock store was opened by process {pid}, which this "
        "process was forked from: it is the parent's. Use the store itself here (it "
        "opens this process's own connections), or lockwarden.connect(url)."
    )
