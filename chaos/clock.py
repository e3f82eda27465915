"""A worker's wall clock, stepped by the nemesis as a bad NTP server or an
administrator's ``date -s`` would step a host's.

A worker of a run with ``clock_steps`` calls `install` first: from then on
``time.time()`` and ``time.time_ns()`` in the worker read the real clock plus
an offset, and SIGUSR1 / SIGUSR2 move the offset `STEP` seconds forward /
back at once. The monotonic clock never jumps (nor does the kernel's), and
the history is stamped with it, so only what reads the wall clock sees the
step: that is what a run with steps tests.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

STEP = 6 * 3600.0
"""Seconds one step moves a worker's wall clock."""

FORWARD, BACK = signal.SIGUSR1, signal.SIGUSR2

_offset = [0.0]


def install() -> None:
    """Make this process's wall clock steppable by `FORWARD` and `BACK`."""
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + _offset[0]
    time.time_ns = lambda: real_time_ns() + int(_offset[0] * 1e9)

    def step(signum: int, _frame: FrameType | None) -> None:
        _offset[0] += STEP if signum == FORWARD else -STEP

    signal.signal(FORWARD, step)
    signal.signal(BACK, step)
