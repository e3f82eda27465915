"""Retries of a call that failed transiently (a dropped connection, a server restarting,
a transaction the database rolled back), shared by every backend."""

from __future__ import annotations

import random

RETRY_DELAYS = (0.05, 0.2, 0.8)
"""Pauses (before jitter) before each retry of a statement that failed transiently."""


def jittered(delay: float) -> float:
    """``delay`` scaled by a random factor from 0.5 to 1.5: clients that failed together
    (a database restart) do not all come back at the same moment."""
    return delay * random.uniform(0.5, 1.5)
