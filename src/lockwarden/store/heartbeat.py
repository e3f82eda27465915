"""One background thread per store that keeps every session of the store alive.

Each session is beaten on its own schedule (every TTL/3) with one statement,
whatever it holds. The thread only schedules (`timer.Timer`); what a beat does
is the session's business (`Session._beat`).
"""

from __future__ import annotations

from typing import Protocol

from lockwarden.store.timer import Timer


class Beating(Protocol):
    @property
    def _beat_due(self) -> float:
        """When (``time.monotonic``) the next beat is due (infinity: none is)."""

    def _beat(self) -> None:
        """Send one heartbeat (or act on a loss); must not raise."""


class Heartbeat(Timer[Beating]):
    name = "lockwarden-heartbeat"

    def _due(self, member: Beating) -> float:
        return member._beat_due

    def _act(self, member: Beating) -> None:
        member._beat()
