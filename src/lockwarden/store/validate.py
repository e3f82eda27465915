"""Checks on everything a caller hands the store, done before anything is stored.

Each failure is a `LockUsageError` (a ValueError) that says what was wrong
and what would be right; the database has not been touched.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from functools import lru_cache

from lockwarden.errors import LockUsageError
from lockwarden.modes import Mode

MAX_NAME_BYTES = 512
"""Lock names and fence resources are non-empty text of at most this many UTF-8 bytes."""

ON_STALE = ("reclaim", "refuse")

MAX_WAIT = threading.TIMEOUT_MAX
"""The longest a thread can wait: every duration (timeout, TTL, max_hold, delay) is
clamped to it, so that no later wait on it overflows — a waiter behind a holder
with an absurd TTL included (`waiting`)."""

MAX_TTL = 86400.0
"""The longest lease a session may have (one day): a crashed holder's locks stay with it,
for waiters on other hosts, for as long, and a lease longer than a day is no lease."""

MAX_INTEGER = 2**63 - 1
"""The largest integer both databases store (BIGINT): permits and fencing tokens stay within."""


def shown(value: object) -> str:
    """``repr(value)`` for a message, at most 60 characters (an integer too long for
    ``repr`` included)."""
    try:
        text = repr(value)
    except ValueError:  # more digits than int-to-str conversion allows
        return f"an integer of {value.bit_length()} bits" if isinstance(value, int) else "?"
    return text if len(text) <= 60 else text[:57] + "..."


def text(value: object, what: str) -> str:
    """Text both databases store alike: valid Unicode (no lone surrogate), no NUL
    (PostgreSQL refuses one that SQLite would keep)."""
    if not isinstance(value, str):
        raise LockUsageError(f"{what} must be a string, got {type(value).__name__} {shown(value)}")
    if "\x00" in value:
        raise LockUsageError(
            f"{what} {value[:40]!r} contains a NUL character (no database stores one)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LockUsageError(f"{what} {value[:40]!r} is not valid Unicode: {exc.reason}") from None
    return value


def name(value: object, what: str = "lock name") -> str:
    value = text(value, what)
    if not value:
        raise LockUsageError(f"{what} must not be empty")
    size = len(value.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise LockUsageError(
            f"{what} {value[:40]!r}... is {size} bytes of UTF-8; the limit is {MAX_NAME_BYTES}"
        )
    return value


def mode(value: object) -> Mode:
    if not isinstance(value, Mode | str):
        raise LockUsageError(f"unknown lock mode {shown(value)}: use 'read' or 'write'")
    parsed = Mode.parse(value)
    if parsed not in (Mode.S, Mode.X):
        raise LockUsageError(
            f"the shared store has 'read' and 'write' locks (Mode.S and Mode.X), not {parsed.value}"
        )
    return parsed


def duration(value: object, what: str, *, zero: bool = True, hint: str = "") -> float:
    """A finite number of seconds, >= 0 (> 0 unless ``zero``), at most `MAX_WAIT`.

    An integer beyond float range is compared as an integer, never converted.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LockUsageError(f"{what} must be a number of seconds, got {shown(value)}{hint}")
    finite = isinstance(value, int) or math.isfinite(value)
    if not finite or value < 0 or (value == 0 and not zero):
        wanted = ">= 0" if zero else "> 0"
        raise LockUsageError(f"{what} must be finite and {wanted}, got {shown(value)}{hint}")
    return MAX_WAIT if value >= MAX_WAIT else float(value)


def ttl(value: object) -> float:
    """A session's TTL: seconds, > 0, at most `MAX_TTL`."""
    seconds = duration(value, "ttl", zero=False)
    if seconds > MAX_TTL:
        raise LockUsageError(
            f"ttl must be at most {MAX_TTL:g} s (one day), got {shown(value)}: a holder that "
            "crashes keeps its locks from other hosts for a TTL, and a longer lease is no lease"
        )
    return seconds


def timeout(value: object) -> float | None:
    """None waits forever, 0 tries once."""
    if value is None:
        return None
    return duration(value, "timeout", hint="; use None to wait without limit")


def max_hold(value: object) -> float | None:
    """None: no limit."""
    if value is None:
        return None
    return duration(value, "max_hold", zero=False, hint="; use None for no limit")


def flag(value: object, what: str) -> bool:
    """True or False, nothing else: an override must be asked for in so many words."""
    if not isinstance(value, bool):
        raise LockUsageError(f"{what} must be True or False, got {shown(value)}")
    return value


def on_stale(value: object) -> bool:
    """Returns whether the policy is "refuse"."""
    if value not in ON_STALE:
        raise LockUsageError(f"on_stale must be 'reclaim' or 'refuse', got {shown(value)}")
    return value == "refuse"


def permits(value: object, what: str, *, none: bool) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INTEGER:
        unlimited = " or None for no limit" if none else ""
        raise LockUsageError(
            f"{what} permits must be an integer from 1 to 2**63 - 1{unlimited}, got {shown(value)}"
        )
    return value


def token(value: object) -> int:
    """A fencing token as a caller hands it to a fence: what a grant gave it, or 0."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INTEGER:
        raise LockUsageError(
            f"a fencing token is an integer from 0 to 2**63 - 1, got {shown(value)}"
        )
    return value


@lru_cache(maxsize=1024)
def _pair(lock_name: str, lock_mode: str | Mode) -> tuple[str, Mode]:
    """A (name, mode) pair checked once: a program takes the same locks over and over,
    and the checks cost a few microseconds a lock. (Only a pair that passes is kept.)"""
    return name(lock_name), mode(lock_mode)


def items(value: object) -> tuple[tuple[str, Mode], ...]:
    """The (name, mode) pairs of a multi-lock: at least one, each name once."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise LockUsageError(f"expected a list of (name, mode) pairs, got {shown(value)}")
    checked: list[tuple[str, Mode]] = []
    for item in value:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise LockUsageError(f"each item must be a (name, mode) pair, got {shown(item)}")
        lock_name, lock_mode = item
        if isinstance(lock_name, str) and isinstance(lock_mode, str | Mode):  # hashable
            checked.append(_pair(lock_name, lock_mode))
        else:
            checked.append((name(lock_name), mode(lock_mode)))
    if not checked:
        raise LockUsageError("a multi-lock needs at least one (name, mode) pair")
    seen: set[str] = set()
    for lock_name, _ in checked:
        if lock_name in seen:
            raise LockUsageError(f"lock name {lock_name!r} appears twice in one multi-lock")
        seen.add(lock_name)
    return tuple(checked)
