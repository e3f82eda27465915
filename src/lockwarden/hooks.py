"""Hooks: what the shared store's sessions did, handed to a program's own metrics or logs.

Subscribe an `Observer` (override the methods you need) with `subscribe`;
`lockwarden.observe.prometheus.PrometheusObserver` is a ready one. Every
event is also a debug record on the ``lockwarden.events`` logger.

Cost when unused: the store makes one check per event, a module attribute
and the events' logger's level (no observer, logger off: nothing is built
or called; bench/store.py measures the check, about 0.1 µs). Observers run on the
thread that made the event (a waiter's, the heartbeat's for a loss): they
must be quick and must not raise; an observer that raises is logged and
skipped, never allowed to fail a lock call.

lockwarden's own log records go through `logger`, which imports `logging`
only when the first record is made: a command-line call that logs nothing
never pays for importing it (milliseconds of every start). A program
that imports logging itself sees no difference.

Words: ``name`` and ``mode`` ("read"/"write") as in `Session.lock`;
``waited`` is seconds from the call to the grant (or to giving up);
``held`` is seconds from the grant to the release.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

__all__ = ["Observer", "subscribe"]

EVENTS = "lockwarden.events"
"""The logger of the events' debug records."""


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
_events: logging.Logger | None = None
"""The events' logger, once `logging` has been imported by anyone."""
_setup: Callable[[ModuleType], None] | None = None
"""What `on_first_log` registered and `logger` has not applied yet."""


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
    return bool(_observers) or _debugging()


def _debugging() -> bool:
    global _events  # noqa: PLW0603 - set once, to the same logger by any thread
    if _events is None:
        # Never imported: then nobody can have asked for debug records.
        found = sys.modules.get("logging")
        if found is None:
            return False
        _events = found.getLogger(EVENTS)
    return _events.isEnabledFor(10)  # logging.DEBUG


def emit(event: str, *args: object) -> None:
    """Send one event to every observer and the debug log (callers check `active` first)."""
    if _debugging():
        logger(EVENTS).debug("%s %s", event, " ".join(map(repr, args)))
    for observer in _observers:
        try:
            getattr(observer, event)(*args)
        except Exception:
            logger(EVENTS).exception("lockwarden observer %r failed on %s", observer, event)


def logger(name: str) -> logging.Logger:
    """The `logging` logger ``name`` (imported now, if it was not), after the setup
    registered with `on_first_log`."""
    global _setup
    import logging  # noqa: PLC0415  (see the module's docstring)

    if _setup is not None:
        with _lock:
            setup, _setup = _setup, None
        if setup is not None:
            setup(logging)
    return logging.getLogger(name)


def on_first_log(setup: Callable[[ModuleType], None]) -> None:
    """Run ``setup(logging)`` just before lockwarden makes its first log record.

    For a program that configures logging only for lockwarden's sake (the
    command line): it pays for importing `logging` only if something is logged.
    """
    global _setup  # noqa: PLW0603
    with _lock:
        _setup = setup
