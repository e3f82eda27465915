"""Hooks: what the shared store's sessions did, handed to a program's own metrics or logs.

Subscribe an `Observer` (override the methods you need) with `subscribe`;
`lockwarden.observe.prometheus.PrometheusObserver` is a ready one. Every
event is also a debug record on the ``lockwarden.events`` logger.

Cost when unused: the store checks one module attribute per event (no
observer, logger off: nothing is built or called). Observers run on the
thread that made the event (a waiter's, the heartbeat's for a loss): they
must be quick and must not raise; an observer that raises is logged and
skipped, never allowed to fail a lock call.

Words: ``name`` and ``mode`` ("read"/"write") as in `Session.lock`;
``waited`` is seconds from the call to the grant (or to giving up);
``held`` is seconds from the grant to the release.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Observer", "subscribe"]

log = logging.getLogger("lockwarden.events")


class Observer:
    """Receives the store's events; each method does nothing unless overridden."""

    def acquired(self, name: str, mode: str, waited: float) -> None:
        """A lock was granted after ``waited`` seconds (0 for one that was free)."""

    def released(self, name: str, mode: str, held: float) -> None:
        """A lock was released after being held ``held`` seconds."""

    def timed_out(self, name: str, mode: str, waited: float) -> None:
        """A request gave up after ``waited`` seconds (`LockTimeout`, a try that found it busy)."""

    def deadlock(self, name: str, mode: str) -> None:
        """A request was refused because waiting would close a cycle (`Deadlock`)."""

    def lost(self, name: str, mode: str) -> None:
        """A held lock was lost (its session expired, or it was broken)."""

    def reclaimed(self, name: str) -> None:
        """A request took ``name`` over from a holder whose session was dead."""


_observers: tuple[Observer, ...] = ()
_lock = threading.Lock()


def subscribe(observer: Observer) -> Callable[[], None]:
    """Start sending events to ``observer``; returns the function that stops it."""
    global _observers  # noqa: PLW0603 - one tuple, replaced whole: readers need no lock
    if not isinstance(observer, Observer):
        raise TypeError(f"expected a lockwarden.hooks.Observer, got {observer!r}")
    with _lock:
        _observers = (*_observers, observer)

    def unsubscribe() -> None:
        global _observers  # noqa: PLW0603
        with _lock:
            _observers = tuple(o for o in _observers if o is not observer)

    return unsubscribe


def active() -> bool:
    """Whether any event would go anywhere: an observer, or the debug logger."""
    return bool(_observers) or log.isEnabledFor(logging.DEBUG)


def emit(event: str, *args: object) -> None:
    """Send one event to every observer and the debug log (callers check `active` first)."""
    log.debug("%s %s", event, " ".join(map(repr, args)))
    for observer in _observers:
        try:
            getattr(observer, event)(*args)
        except Exception:
            log.exception("lockwarden observer %r failed on %s", observer, event)
