"""Retries of a call that failed transiently (a dropped connection, a server restarting,
a transaction the database rolled back), shared by the SQL backends' retry loops
(etcd's tries the cluster's members in turn instead)."""

from __future__ import annotations

import random
import time
from typing import Literal

RETRY_DELAYS = (0.05, 0.2, 0.8)
"""Pauses (before jitter) before each retry of a statement that failed transiently."""


def jittered(delay: float) -> float:
    """``delay`` scaled by a random factor from 0.5 to 1.5: clients that failed together
    (a database restart) do not all come back at the same moment."""
    return delay * random.uniform(0.5, 1.5)


def verdict(
    delay: float | None, transient: bool, end: float
) -> float | Literal["overran", "failed"]:
    """What follows a failed try of a call that must end by ``end`` (`time.monotonic`),
    with ``delay`` the pause before the next try (None: that was the last):

    - "overran": the failure was transient, but the call has no time left for the pause
      and another try (the caller raises `bounds.overran`: the outcome is unknown);
    - "failed": the failure was not transient, or no try is left (the caller raises the
      database's error);
    - else the pause (`jittered`) to sleep before trying again.
    """
    if transient and time.monotonic() + (delay or 0.0) >= end:
        return "overran"
    if delay is None or not transient:
        return "failed"
    return jittered(delay)
