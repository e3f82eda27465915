"""What every command shares: exit statuses, the one-line error, the database.

The exit statuses follow BSD's sysexits.h where one fits, so that cron,
systemd and shell scripts can tell "try again later" (75) from "broken
setup" (64, 69) without reading the message.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import lockwarden
from lockwarden.store import Store

EX_USAGE = 64
"""Bad arguments: an unknown option, a bad number or name, no command after ``--``."""
EX_UNAVAILABLE = 69
"""The database cannot be used: a bad URL, unreachable, or written by a newer lockwarden."""
EX_SOFTWARE = 70
"""The lock was lost while CMD ran (or lockwarden itself failed unexpectedly)."""
EX_OSERR = 71
"""The operating system refused something lockwarden needed (not CMD's own failures)."""
EX_TEMPFAIL = 75
"""`lockwarden run`: the lock was busy; try again later."""
EX_NOEXEC = 126
"""`lockwarden run`: CMD exists but cannot be executed (as shells report it)."""
EX_NOTFOUND = 127
"""`lockwarden run`: CMD was not found (as shells report it)."""

DB_ENV = "LOCKWARDEN_DB"


class CliError(Exception):
    """A failure with its exit status and the one line that explains it."""

    def __init__(self, status: int, message: str, prog: str = "lockwarden") -> None:
        super().__init__(message)
        self.status = status
        self.prog = prog


def say(message: object, prog: str = "lockwarden") -> None:
    """Write ``message`` to stderr as exactly one line, whatever newlines it carries.

    Operators grep logs and cron mails line by line; a message split over
    lines (or a traceback) gets lost or misread there.
    """
    text = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    print(f"{prog}: {text}", file=sys.stderr, flush=True)


def database_url(option: str | None) -> str:
    """The store to use: ``--db``, else ``$LOCKWARDEN_DB``, else the user's SQLite file.

    The default lives in the user's state directory (XDG_STATE_HOME on Linux),
    which is created here, so the first command on a fresh machine works.
    """
    url = option if option is not None else os.environ.get(DB_ENV) or None
    if url is not None:
        return url
    from platformdirs import user_state_path  # noqa: PLC0415  (only without --db)

    directory = user_state_path("lockwarden")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(
            EX_UNAVAILABLE,
            f"cannot create the state directory {directory} for the default database "
            f"({exc.strerror}); give one with --db URL or {DB_ENV}",
        ) from exc
    return f"sqlite:///{directory / 'locks.db'}"


@contextmanager
def open_store(url: str) -> Iterator[Store]:
    """Connect (creating or upgrading the tables), and close the store afterwards.

    A command line has no business giving up behind a long-running holder,
    so waiters never time out on ``max_hold``: ``--wait`` alone decides.
    """
    try:
        store = lockwarden.connect(url, max_hold=None)
    except lockwarden.LockError as exc:
        raise CliError(EX_UNAVAILABLE, str(exc)) from exc
    try:
        yield store
    finally:
        store.close()


def mode_word(mode: lockwarden.Mode) -> str:
    """The store's words for its two modes, as the command line spells them."""
    return "read" if mode is lockwarden.Mode.S else "write"
