"""What every command shares: exit statuses, the failure type, the database, the output.

The exit statuses follow BSD's sysexits.h where one fits, so that cron,
systemd and shell scripts can tell "try again later" (75) from "broken
setup" (64, 69) without reading the message.

Nothing here imports the store at module level: ``lockwarden --version`` and
``lockwarden completion`` must not pay for it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from lockwarden import LockError, hooks
from lockwarden.cli.terminal import printable

if TYPE_CHECKING:
    from lockwarden.store import Store

EX_USAGE = 64
"""Bad arguments: an unknown option, a bad number or name, no command after ``--``."""
EX_UNAVAILABLE = 69
"""The database cannot be used: a bad URL, unreachable, no store there, or too new."""
EX_SOFTWARE = 70
"""The lock was lost while CMD ran (or lockwarden itself failed unexpectedly)."""
EX_OSERR = 71
"""The operating system refused something lockwarden needed (not CMD's own failures)."""
EX_TEMPFAIL = 75
"""`lockwarden run` and `hold`: the lock was busy; try again later."""
EX_NOEXEC = 126
"""`lockwarden run`: CMD exists but cannot be executed (as shells report it)."""
EX_NOTFOUND = 127
"""`lockwarden run`: CMD was not found (as shells report it)."""

DB_ENV = "LOCKWARDEN_DB"

CALL_TIMEOUT_ENV = "LOCKWARDEN_CALL_TIMEOUT"
"""Seconds one call to the database may take (``--call-timeout`` sets it for the command)."""

JSON_FORMAT = 1
"""The version of every ``--json`` shape (docs/cli.md); a field removed or changed bumps it."""


class CliError(Exception):
    """A failure with its exit status and the one line that explains it."""

    def __init__(self, status: int, message: str, prog: str = "lockwarden") -> None:
        super().__init__(message)
        self.status = status
        self.prog = prog


def emit(args: argparse.Namespace, text: str, shape: dict[str, Any]) -> None:
    """A command's result on stdout: ``text`` for people, ``shape`` with ``--json``.

    Text is escaped (`printable`): it shows names and hosts that anyone who
    can take a lock chose. JSON escapes by itself.
    """
    if args.json:
        import json  # noqa: PLC0415  (only with --json)

        print(json.dumps({"format": JSON_FORMAT, **shape}, indent=2))
    elif not args.quiet:
        print(printable(text))


def database_url(option: str | None) -> str:
    """The store to use: ``--db``, else ``$LOCKWARDEN_DB``, else the user's SQLite file.

    The default lives in the user's state directory (`state_directory`),
    which is created here, so the first command on a fresh machine works.
    """
    url = option if option is not None else os.environ.get(DB_ENV) or None
    if url is not None:
        return url
    directory = state_directory()
    try:
        os.makedirs(directory, exist_ok=True)
        os.chmod(directory, 0o700)  # lockwarden's own: the store in it is private (0600)
    except OSError as exc:
        raise CliError(
            EX_UNAVAILABLE,
            f"cannot create the state directory {directory} for the default database "
            f"({exc.strerror}); give one with --db URL or {DB_ENV}",
        ) from exc
    return _default_url()


def _default_url() -> str:
    return f"sqlite:///{os.path.join(state_directory(), 'locks.db')}"


def _create_private(url: str) -> None:
    """Create the default store's file 0600, if missing, before the store opens it.

    A store's files follow the umask and the directory's group, as any
    program's files do, so that users of one host can share one
    (docs/operators.md); SQLite gives the -wal and -shm files the database
    file's mode, and the store gives it to its -writer file too. The
    default store is the user's own, in a directory of its own (0700), and
    its files are private as well: made 0600 here, they stay so. The choice
    is the command line's, made with the file itself rather than with an
    option of `lockwarden.connect`: a program that wants a private store
    sets its umask, or creates the file, as it would for any file.
    """
    if url != _default_url():
        return
    path = url[len("sqlite:///") :]
    with suppress(OSError):  # there already; or not to be made, which the store explains
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600))


def state_directory() -> str:
    """lockwarden's directory among the user's state: ``$XDG_STATE_HOME/lockwarden``.

    The XDG base directory rule: ``$XDG_STATE_HOME`` when it is an absolute
    path, else ``~/.local/state`` (``~/Library/Application Support`` on
    macOS, where Apple's conventions apply). It is written out here rather
    than asked of platformdirs, whose import alone costs every command
    several milliseconds (pathlib, tempfile, random) for this one path.
    """
    base = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the rule says ignore it
        base = "~/Library/Application Support" if sys.platform == "darwin" else "~/.local/state"
    return os.path.join(os.path.expanduser(base), "lockwarden")


@contextmanager
def open_store(url: str, *, create: bool) -> Iterator[Store]:
    """Connect, and close the store afterwards.

    ``create``: make the store's tables where there are none. Commands that
    only look or tidy up pass False, so that a mistyped path or schema is
    reported (status 69) instead of quietly becoming an empty store. A
    command line has no business giving up behind a long-running holder, so
    waiters never time out on ``max_hold``: ``--wait`` alone decides.
    """
    import lockwarden  # noqa: PLC0415  (the store's import is what `--version` must not pay)

    if not _is_sqlite(url):  # its driver logs: shown as lockwarden's own lines from the start
        hooks.logger("lockwarden")
    elif create:
        _create_private(url)
    try:
        store = lockwarden.connect(url, max_hold=None, create=create, call_timeout=call_timeout())
    except lockwarden.LockError as exc:
        raise CliError(EX_UNAVAILABLE, str(exc)) from exc
    try:
        yield store
    finally:
        store.close()


def call_timeout() -> float:
    """``--call-timeout``, else ``$LOCKWARDEN_CALL_TIMEOUT``, else the store's default."""
    from lockwarden.store.bounds import CALL_TIMEOUT  # noqa: PLC0415

    given = os.environ.get(CALL_TIMEOUT_ENV, "")
    if not given:
        return CALL_TIMEOUT
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise CliError(
            EX_USAGE, f"${CALL_TIMEOUT_ENV} must be a number of seconds > 0, got {given!r}"
        )
    return seconds


def _is_sqlite(url: str) -> bool:
    """Whether ``url`` names a SQLite file (whose store logs nothing a driver says)."""
    from lockwarden.store.opening import parse_url  # noqa: PLC0415  (as `connect` would)

    try:
        return parse_url(url).backend == "sqlite"
    except LockError:  # `connect` says what is wrong with it
        return True
