"""A session's lease, judged on the holder's own clock, by a thread no call can hold up.

The database decides when another client may take a session's locks: once
its clock has passed the session's last heartbeat by the TTL (design note,
"The liveness predicate"). The holder cannot read that clock, and in a
partition it cannot ask. So it keeps a deadline of its own on its monotonic
clock, and gives its locks up at that deadline whatever the network does:

    deadline = sent + ttl - margin,   margin = ttl * MARGIN

``sent`` is when the last renewal that the database confirmed was *sent*
(or the session's opening: the database stamps its clock while it runs the
statement, after ``sent``). The database may let the lock go ``ttl``
seconds of its clock after that stamp, so no earlier than ``ttl`` seconds of
real time after ``sent`` if its clock runs at the true rate. The margin
covers the rest:

- clock rates: the holder's clock may run slow and the database's fast. With
  each off by at most `DRIFT` (1,000 ppm, twice the most NTP ever slews a
  clock), the holder's ``ttl - margin`` lasts at most
  ``(ttl - margin) * (1 + DRIFT)`` real seconds and the database's ``ttl`` at
  least ``ttl * (1 - DRIFT)``: 0.2 % of the TTL;
- acting on it: this module's thread must wake, mark the session lost, and
  the program (or `lockwarden run`'s CMD, killed then) must stop. That is
  the other 9.8 % of the TTL: 1.47 s of the default 15 s, 0.2 s of a 2 s TTL.

A holder whose process is paused (SIGSTOP, a frozen VM) cannot act on any
deadline; that is what fencing tokens are for. Nor can a holder whose clock
jumps. The clock used (`now`) never jumps: on Linux it is CLOCK_BOOTTIME,
the monotonic clock (only ever slewed, never stepped) plus the time the
machine spent suspended. A machine that slept (a laptop's suspend) was a
paused holder meanwhile, but on waking it finds its lease over at once
(within `LOOK_EVERY`), where the monotonic clock, stopped while it slept,
would keep the lease for up to the TTL more while the database has moved on.

A renewal counts only if its reply arrives before the deadline it would
move: a later reply proves nothing (the lock may already have passed on),
and a session once lost is never revived (`Session._renew_lease`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Protocol

from lockwarden.store.timer import Timer

MARGIN = 0.1
"""The fraction of the TTL by which the local deadline comes before the database's."""

DRIFT = 0.001
"""The largest relative error of a clock's rate that the margin allows for, on each side."""

LOOK_EVERY = 1.0
"""The longest the lease timer sleeps: how soon after a suspend it sees a lease ended (the
sleep itself is measured on the monotonic clock, which a suspend stops)."""


def _clock() -> Callable[[], float]:
    """CLOCK_BOOTTIME where the system has it (Linux), else ``time.monotonic``."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.monotonic
    try:
        time.clock_gettime(boottime)
    except OSError:
        return time.monotonic
    return functools.partial(time.clock_gettime, boottime)


now: Callable[[], float] = _clock()
"""The clock leases are judged by (seconds, from an arbitrary start; see above)."""


def deadline(sent: float, ttl: float) -> float:
    """The local deadline of a lease renewed by a request sent at ``sent`` (`now`)."""
    return sent + ttl - ttl * MARGIN


class Leased(Protocol):
    @property
    def _lease_deadline(self) -> float:
        """When (`now`) the lease runs out; infinity once it no longer matters (lost or
        closed)."""

    def _lease_ended(self) -> None:
        """Called at the deadline: mark the loss; must return at once (no database call)."""


class LeaseTimer(Timer[Leased]):
    """One thread per store that ends each of its sessions' leases at its deadline.

    It only sleeps until the earliest deadline and calls `Leased._lease_ended`,
    which touches no database: the heartbeat thread may be stuck in a call that
    a partition holds up, and the lease must end on time all the same. It looks
    at least every `LOOK_EVERY`, on the lease clock (`now`), so a suspend does
    not put it off.
    """

    name = "lockwarden-lease"
    longest = LOOK_EVERY

    def _now(self) -> float:
        return now()

    def _due(self, member: Leased) -> float:
        return member._lease_deadline

    def _act(self, member: Leased) -> None:
        member._lease_ended()
