"""The line shown while `run` or `hold` waits for a lock: who holds it, for how long."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from lockwarden.cli.terminal import one_line, say


class Progress:
    """While a command waits for a lock, say who holds it and for how long.

    On a terminal (stderr a TTY) one line is rewritten in place every second
    and erased when the wait ends; ``verbose`` elsewhere (a log) writes a
    line when the wait starts to matter and one when it ends, never a
    stream of carriage returns. ``describe`` is called from this thread and
    returns what blocks the lock now (it asks the database on its own
    connection). Nothing is shown for a wait shorter than ``delay``.
    """

    def __init__(
        self,
        what: str,
        describe: Callable[[], str],
        *,
        verbose: bool,
        quiet: bool,
        delay: float = 0.5,
    ) -> None:
        self._what = what
        self._describe = describe
        self._tty = sys.stderr.isatty() and not quiet
        self._verbose = verbose and not quiet
        self._delay = delay
        self._done = threading.Event()
        self._shown = False
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="lockwarden-progress", daemon=True)

    def __enter__(self) -> Progress:
        if self._tty or self._verbose:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._shown and self._tty:
            print("\r\033[K", end="", file=sys.stderr, flush=True)

    def _run(self) -> None:
        if self._done.wait(self._delay):
            return
        while not self._done.is_set():
            try:
                blocker = self._describe()
            except Exception as exc:  # the database away: the wait itself will say so
                blocker = f"cannot tell who holds it ({type(exc).__name__})"
            waited = time.monotonic() - self._started
            line = one_line(f"waiting {waited:.0f} s for the {self._what}: {blocker}")
            if self._done.is_set():
                return
            if self._tty:
                width = _width()
                print(f"\r\033[K{line[: width - 1]}", end="", file=sys.stderr, flush=True)
                self._shown = True
            elif not self._shown:
                say(line)
                self._shown = True
            self._done.wait(1.0)


def _width() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns or 80
    except OSError:
        return 80
