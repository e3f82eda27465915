"""A manager's settings, checked once when it is made and never changed after, and its time limits.

Settings are a frozen record: `LockManager` shows them as read-only
properties, so a value is checked where it is given and every rule that
reads it sees the same one for the manager's life (a threshold changed on a
live manager would have to be applied to locks taken under the old one).

Time limits (README.md, "Waiting and waking") come in two classes: rows and
intention locks, and locks covering a table or more (S, SIX, X above the last
level) with exclusive metadata locks. Each class has a default and a maximum;
`limit` turns a call's ``timeout`` into seconds by the contract of
docs/contract.md.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from lockwarden.errors import LockUsageError
from lockwarden.local._deadlock import VICTIMS, Victim


class _Default(enum.Enum):
    DEFAULT = "the manager's default"

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default.DEFAULT
"""The value of an omitted ``timeout``: the manager's default for the lock's class."""
Timeout = float | None | _Default
"""What a lock call accepts as ``timeout``: seconds, None (no limit of its own), or DEFAULT."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything `LockManager` is configured with; see its docstring for each one's meaning."""

    levels: tuple[str, ...]
    strict: bool
    wait_timeout: float | None
    max_wait_timeout: float | None
    ddl_wait_timeout: float | None
    max_ddl_wait_timeout: float | None
    victim: Victim
    deadlock_max_steps: int
    deadlock_max_depth: int
    escalation_threshold: int | None
    escalation_retry: int
    metadata_locks: bool
    metadata_exclusive_streak: int

    def __post_init__(self) -> None:
        levels = self.levels
        if (
            not isinstance(levels, tuple)
            or not levels
            or not all(isinstance(level, str) and level for level in levels)
        ):
            raise LockUsageError(f"levels must be a non-empty tuple of level names, got {levels!r}")
        if self.victim not in VICTIMS:
            raise LockUsageError(f"victim must be one of {', '.join(VICTIMS)}; got {self.victim!r}")
        for name in (
            "deadlock_max_steps",
            "deadlock_max_depth",
            "escalation_retry",
            "metadata_exclusive_streak",
        ):
            _check_positive_int(name, getattr(self, name))
        if self.escalation_threshold is not None:
            _check_positive_int("escalation_threshold", self.escalation_threshold)
        for name in ("strict", "metadata_locks"):
            if not isinstance(getattr(self, name), bool):
                raise LockUsageError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("wait_timeout", "ddl_wait_timeout"):
            default, maximum = getattr(self, name), getattr(self, "max_" + name)
            if maximum is not None:
                check_seconds("max_" + name, maximum)
            if default is not None:
                check_seconds(name, default)
                if maximum is not None and default > maximum:
                    raise LockUsageError(f"{name}={default} is above max_{name}={maximum}")

    def limit(self, coarse: bool, timeout: Timeout) -> float:
        """The call's time limit in seconds (``math.inf``: none).

        Omitted: the class default. None: no limit of the call's own, so the
        class maximum (none if that is None). A number: itself, if within the
        maximum; above it, `LockUsageError` before anything is acquired.
        """
        if coarse:
            default, maximum = self.ddl_wait_timeout, self.max_ddl_wait_timeout
        else:
            default, maximum = self.wait_timeout, self.max_wait_timeout
        if timeout is DEFAULT:
            timeout = default
        if timeout is None:
            return math.inf if maximum is None else maximum
        check_seconds("timeout", timeout, hint="; use None to wait without limit")
        if maximum is not None and timeout > maximum:
            label = "ddl_" if coarse else ""
            raise LockUsageError(
                f"timeout={timeout} s is above this manager's max_{label}wait_timeout={maximum} s; "
                f"wait less, or raise the maximum (None removes it)"
            )
        return timeout


def check_seconds(name: str, value: object, *, hint: str = "") -> None:
    """A finite number of seconds, >= 0: `LockUsageError` otherwise (NaN and infinity too)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LockUsageError(f"{name} must be a number of seconds, got {value!r}{hint}")
    if not math.isfinite(value) or value < 0:
        raise LockUsageError(f"{name} must be a finite number of seconds >= 0, got {value!r}{hint}")


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LockUsageError(f"{name} must be a positive integer, got {value!r}")
