"""The ``lockwarden`` command line (DESIGN part C): the shared store without writing code.

``lockwarden run NAME -- CMD`` is flock(1) for a fleet of hosts; ``status``,
``break``, ``clean``, ``permits`` and ``init`` look after the store. Every
failure is one line on stderr and a documented exit status (docs/cli.md),
never a traceback: the command line is used from cron and scripts, where a
traceback is noise and the status is what gets acted on.

Imports stay light: ``run`` on SQLite must add little to CMD, so rich,
psycopg and platformdirs are imported only by the commands that need them.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from lockwarden import LockError, LockLost, LockUsageError, __version__
from lockwarden.cli import admin
from lockwarden.cli.common import (
    DB_ENV,
    EX_OSERR,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    CliError,
    database_url,
    say,
)
from lockwarden.cli.run import run

__all__ = ["main"]

T = TypeVar("T")

EXIT_STATUSES = f"""\
exit status:
  0        done (run: CMD's own status is passed through; killed by signal N: 128+N)
  1        break: the confirmation was declined
  {EX_USAGE}       bad arguments (run: also a missing command after --)
  {EX_UNAVAILABLE}       the database cannot be used: bad URL, unreachable, or too new
  {EX_SOFTWARE}       run: the lock was lost while CMD ran (CMD was stopped); or a bug
  {EX_OSERR}       the operating system refused something lockwarden needed
  {EX_TEMPFAIL}       run: the lock was busy for --wait seconds (see --conflict-exit-code)
  126, 127 run: CMD could not be executed, or was not found
  128+N    run: lockwarden got signal N before CMD started"""

DATABASE = f"""\
database: --db URL, else ${DB_ENV}, else an SQLite file in the user's state
directory (~/.local/state/lockwarden/locks.db on Linux), created on first use.
URLs: sqlite:////abs/path.db, postgresql://user@host:5432/db?schema=NAME"""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line and exit status 64 (EX_USAGE), not 2."""

    def error(self, message: str) -> NoReturn:
        raise CliError(EX_USAGE, f"{message} (see '{self.prog} --help')", prog=self.prog)


def _checked(parse: Callable[[str], T], ok: Callable[[T], bool], wanted: str) -> Callable[[str], T]:
    """An argparse ``type`` that says what it wanted: "--wait: 'x' is not a number of seconds"."""

    def convert(text: str) -> T:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        return value

    return convert


_seconds = _checked(float, lambda v: math.isfinite(v) and v >= 0, "a number of seconds >= 0")
_ttl = _checked(float, lambda v: math.isfinite(v) and v > 0, "a number of seconds > 0")
_exit_status = _checked(int, lambda v: 0 <= v <= 255, "an exit status from 0 to 255")
_permits = _checked(int, lambda v: v >= 1, "a whole number >= 1")
_read_permits = _checked(
    lambda t: None if t == "unlimited" else int(t),
    lambda v: v is None or v >= 1,
    "a whole number >= 1 or 'unlimited'",
)


def _parser() -> _Parser:
    # Options every command takes, before or after its name. The parent's
    # actions are shared by every parser, so their defaults must not be set
    # per parser: --db is simply absent unless given.
    common = _Parser(add_help=False)
    common.add_argument(
        "--db",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=f"the lock store (default: ${DB_ENV}, else the SQLite file in your state directory)",
    )
    common.add_argument("--version", action="version", version=f"lockwarden {__version__}")

    def command(
        name: str, summary: str, epilog: str | None = None, usage: str | None = None
    ) -> _Parser:
        return commands.add_parser(
            name,
            parents=[common],
            help=summary,
            description=summary,
            epilog=epilog,
            usage=usage,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )

    top = _Parser(
        prog="lockwarden",
        description="Database-grade locks shared by processes and hosts, from the shell.",
        epilog=f"{DATABASE}\n\n{EXIT_STATUSES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
        allow_abbrev=False,
    )
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = command(
        "run",
        "Run CMD while holding the lock NAME; release it when CMD ends.",
        usage="lockwarden run [options] NAME -- CMD [ARGS...]",
        epilog=(
            "CMD sees LOCKWARDEN_NAME and LOCKWARDEN_TOKEN (the fencing token) in its\n"
            "environment. SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to CMD (Ctrl-C\n"
            "is not passed twice: the terminal already sent it). If the lock is lost while\n"
            "CMD runs, CMD gets SIGTERM, then SIGKILL after --kill-after seconds; if\n"
            "lockwarden itself is killed, CMD gets SIGKILL (Linux).\n\n"
            f"{DATABASE}\n\n{EXIT_STATUSES}"
        ),
    )
    p.add_argument("name", metavar="NAME", help="the lock's name (any text up to 512 bytes)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--read", dest="mode", action="store_const", const="read", help="a shared lock"
    )
    mode.add_argument(
        "--write",
        dest="mode",
        action="store_const",
        const="write",
        help="an exclusive lock (the default)",
    )
    p.set_defaults(mode="write", handler=run)
    p.add_argument(
        "--wait",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the lock, in queue order (default 0: try once)",
    )
    p.add_argument(
        "--ttl",
        type=_ttl,
        default=15.0,
        metavar="SECONDS",
        help="the lock is lost this long after the last heartbeat, e.g. if this "
        "process is frozen or killed (default 15; heartbeats every TTL/3)",
    )
    p.add_argument(
        "--kill-after",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="after a lost lock, SIGKILL CMD this long after SIGTERM (default 10)",
    )
    p.add_argument(
        "--conflict-exit-code",
        type=_exit_status,
        default=EX_TEMPFAIL,
        metavar="N",
        help=f"exit status when the lock is busy (default {EX_TEMPFAIL}; 0 makes a busy lock "
        "a quiet success, e.g. for cron jobs that just skip a turn)",
    )
    p.add_argument(
        "--app",
        default="lockwarden-run",
        metavar="APP",
        help="the app id the holder shows in status and in conflict messages "
        "(default lockwarden-run)",
    )

    p = command(
        "status",
        "Show the locks held and the requests waiting.",
        epilog="--json prints {format, database, locks: [...], waiters: [...]}, times in\n"
        "seconds; docs/cli.md describes every field.",
    )
    p.add_argument(
        "prefix", nargs="?", default="", metavar="NAME-PREFIX", help="only names starting so"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=admin.status)

    p = command(
        "break",
        "Remove every holder of NAME (an administrator's override).",
        epilog="The next grant of NAME gets a larger fencing token, so storage that checks\n"
        "tokens turns away the broken holder's late writes. A `lockwarden run` whose lock\n"
        "is broken stops its CMD and exits 70.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")
    p.set_defaults(handler=admin.break_lock)

    p = command("clean", "Remove expired sessions, their locks, and dead waiters.")
    p.set_defaults(handler=admin.clean)

    p = command(
        "permits",
        "Show NAME's permits, or set them: how many may hold it at once in each mode.",
        epilog="Readers and writers always exclude each other. An option left out keeps its\n"
        "current value. Defaults: read unlimited, write 1.",
    )
    p.add_argument("name", metavar="NAME")
    for option, convert, metavar in (
        ("--read", _read_permits, "N|unlimited"),
        ("--write", _permits, "N"),
    ):
        p.add_argument(
            option,
            type=convert,
            default=argparse.SUPPRESS,  # left out: keeps its value
            metavar=metavar,
            help=f"how many may hold it at once in {option[2:]} mode",
        )
    p.set_defaults(handler=admin.permits)

    p = command("init", "Create or upgrade the store's tables and say where the database is.")
    p.set_defaults(handler=admin.init)
    return top


def _parse(argv: list[str]) -> argparse.Namespace:
    """Parse the options; for `run`, CMD is everything after the first ``--``, verbatim.

    argparse itself would take CMD's own options for lockwarden's, and (on
    Python 3.11) drop a second ``--`` that belongs to CMD.
    """
    parser = _parser()
    head, cmd = argv, None
    if "--" in argv:
        split = argv.index("--")
        head, cmd = argv[:split], argv[split + 1 :]
    args, extra = parser.parse_known_args(head)
    if args.command != "run":
        return parser.parse_args(argv)  # there "--" only ends the options, as usual
    prog = "lockwarden run"
    if extra:
        raise CliError(
            EX_USAGE,
            f"unrecognized arguments: {' '.join(extra)} (the command goes after --: "
            "lockwarden run NAME -- CMD [ARGS...])",
            prog=prog,
        )
    if not cmd:
        raise CliError(
            EX_USAGE, "missing the command after --: lockwarden run NAME -- CMD [ARGS...]", prog
        )
    args.cmd = cmd
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The ``lockwarden`` executable; returns the exit status (docs/cli.md lists them)."""
    # What the store logs (a heartbeat retried while the database is away) is
    # worth seeing during a long run: as one line, like everything else here.
    logging.basicConfig(format="lockwarden: %(message)s")
    try:
        args = _parse(list(sys.argv[1:] if argv is None else argv))
        status: int = args.handler(args, database_url(getattr(args, "db", None)))
        return status
    except CliError as exc:
        say(exc, exc.prog)
        return exc.status
    except LockUsageError as exc:  # a bad name or app id, found by the store
        say(exc)
        return EX_USAGE
    except LockLost as exc:
        say(exc)
        return EX_SOFTWARE
    except LockError as exc:  # StoreError: the database failed us mid-way
        say(exc)
        return EX_UNAVAILABLE
    except BrokenPipeError:  # `lockwarden status | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # as if killed by SIGPIPE, like other tools in a pipe
    except OSError as exc:
        say(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}")
        return EX_OSERR
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except Exception as exc:
        say(
            f"internal error: {type(exc).__name__}: {exc} (please report this, with the "
            "command that caused it, to the lockwarden developers)"
        )
        return EX_SOFTWARE
