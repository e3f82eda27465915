"""The entry module of ``lockwarden``: the parser, the dispatch, and failure as an exit status.

Every command is declared here, with its options and help, so that the help
text, shell completion and the man page (`generate`) all come from this one
parser. A command's work lives in its own module, named in its ``handler``
("module:function") and imported only when that command runs: ``lockwarden
--version`` imports neither the store nor rich, and ``run`` on SQLite does
not import asyncio, psycopg or rich, because a shell script pays the
start-up on every call.

Every failure is one line on stderr and a documented exit status
(docs/cli.md), never a traceback: the command line is used from cron and
scripts, where a traceback is noise and the status is what gets acted on.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn, TypeVar

from lockwarden import LockError, LockLost, LockUsageError, __version__, hooks
from lockwarden.cli.common import (
    CALL_TIMEOUT_ENV,
    DB_ENV,
    EX_OSERR,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    CliError,
    database_url,
)
from lockwarden.cli.terminal import say

if TYPE_CHECKING:
    import logging

__all__ = ["main", "parser"]

T = TypeVar("T")

EXIT_STATUSES = f"""\
exit status:
  0        done (run: CMD's own status is passed through; killed by signal N: 128+N)
  1        break: the confirmation was declined
  {EX_USAGE}       bad arguments (run: also a missing command after --)
  {EX_UNAVAILABLE}       the database cannot be used: bad URL, unreachable, no store there
           (commands other than run, hold and init never create one), or too new
  {EX_SOFTWARE}       run, hold: the lock was lost while held (CMD was stopped); or a bug
  {EX_OSERR}       the operating system refused something lockwarden needed
  {EX_TEMPFAIL}       run, hold: the lock was busy for --wait seconds (see --conflict-exit-code)
  126, 127 run: CMD could not be executed, or was not found
  128+N    run, hold: lockwarden got signal N before the lock was taken"""

DATABASE = f"""\
database: --db URL, else ${DB_ENV}, else an SQLite file in the user's state
directory (~/.local/state/lockwarden/locks.db on Linux), created on first use.
URLs: SQLite: a file path, or sqlite:////abs/path.db
      PostgreSQL: postgresql://user@host:5432/db?schema=NAME
      MariaDB/MySQL: mysql://user@host:3306/db
      etcd: etcd://host:2379,host2:2379,host3:2379/PREFIX"""

SHELLS = ("bash", "zsh")


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line and exit status 64 (EX_USAGE), not 2."""

    def error(self, message: str) -> NoReturn:
        raise CliError(EX_USAGE, f"{message} (see '{self.prog} --help')", prog=self.prog)


def _checked(parse: Callable[[str], T], ok: Callable[[T], bool], wanted: str) -> Callable[[str], T]:
    """An argparse ``type`` that says what it wanted: "--wait: 'x' is not a number of seconds"."""

    def convert(text: str) -> T:
        try:
            value = parse(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        return value

    return convert


FOREVER = ("forever", "inf", "infinity")
"""What ``--wait`` takes for "no time limit"."""

_seconds = _checked(float, lambda v: math.isfinite(v) and v >= 0, "a number of seconds >= 0")
_wait = _checked(
    lambda t: None if t.lower() in FOREVER else float(t),
    lambda v: v is None or (math.isfinite(v) and v >= 0),
    "a number of seconds >= 0 or 'forever'",
)
_positive = _checked(float, lambda v: math.isfinite(v) and v > 0, "a number of seconds > 0")
_interval = _checked(float, lambda v: math.isfinite(v) and v >= 0.1, "a number of seconds >= 0.1")
_port = _checked(int, lambda v: 0 <= v <= 65535, "a port number from 0 to 65535")
_exit_status = _checked(int, lambda v: 0 <= v <= 255, "an exit status from 0 to 255")
_permits = _checked(int, lambda v: v >= 1, "a whole number >= 1")
_read_permits = _checked(
    lambda t: None if t == "unlimited" else int(t),
    lambda v: v is None or v >= 1,
    "a whole number >= 1 or 'unlimited'",
)


COMMANDS = (
    "run",
    "hold",
    "status",
    "break",
    "clean",
    "permits",
    "init",
    "dashboard",
    "metrics",
    "completion",
    "manpage",
)


def _common_options() -> _Parser:
    """The options every command takes, before or after its name.

    The parent's actions are shared by every parser, so their defaults must not
    be set per parser: each is simply absent unless given (read with getattr).
    """
    common = _Parser(add_help=False)
    common.add_argument(
        "--db",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=f"the lock store (default: ${DB_ENV}, else the SQLite file in your state directory)",
    )
    common.add_argument(
        "--call-timeout",
        type=_positive,
        metavar="SECONDS",
        default=argparse.SUPPRESS,
        help=f"the longest one call to the database may take, retries included (default: "
        f"${CALL_TIMEOUT_ENV}, else 5)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="machine-readable output on stdout; failures as one JSON object on stderr",
    )
    talk = common.add_mutually_exclusive_group()
    talk.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="say what happens: the wait for a lock, its grant and its release",
    )
    talk.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print only failures (no results, no progress line)",
    )
    common.add_argument("--version", action="version", version=f"lockwarden {__version__}")
    return common


def parser(only: str | None = None) -> _Parser:
    """The whole command line: every command, option and help text.

    ``only``: declare that one command alone. Declaring all of them costs
    milliseconds that every call of a script would pay, for nothing: a
    command's arguments are parsed by its own parser only.
    """
    common = _common_options()

    def command(
        name: str, handler: str, summary: str, epilog: str | None = None, usage: str | None = None
    ) -> _Parser:
        sub = commands.add_parser(
            name,
            parents=[common],
            help=summary,
            description=summary,
            epilog=epilog,
            usage=usage,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )
        sub.set_defaults(handler=handler)
        return sub

    top = _Parser(
        prog="lockwarden",
        description="Database-grade locks shared by processes and hosts, from the shell,\n"
        "through SQLite, PostgreSQL, MariaDB/MySQL or an etcd cluster.",
        epilog=f"{DATABASE}\n\n{EXIT_STATUSES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
        allow_abbrev=False,
    )
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)

    if only in (None, "run"):
        p = command(
            "run",
            "lockwarden.cli.run:run",
            "Run CMD while holding the lock NAME; release it when CMD ends.",
            usage="lockwarden run [options] NAME -- CMD [ARGS...]",
            epilog=(
                "CMD sees LOCKWARDEN_NAME and LOCKWARDEN_TOKEN (the fencing token) in its\n"
                "environment. SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to CMD (Ctrl-C\n"
                "is not passed twice: the terminal already sent it). If the lock is lost while\n"
                "CMD runs, CMD gets SIGTERM, then SIGKILL after --kill-after seconds; if\n"
                "lockwarden itself is killed, CMD gets SIGKILL (Linux). If the release after\n"
                "CMD fails, the status is still CMD's, and a line on stderr says so.\n\n"
                f"{DATABASE}\n\n{EXIT_STATUSES}"
            ),
        )
        _lock_options(p, app="lockwarden-run")
        p.add_argument(
            "--kill-after",
            type=_seconds,
            default=10.0,
            metavar="SECONDS",
            help="after a lost lock, SIGKILL CMD this long after SIGTERM (default 10)",
        )

    if only in (None, "hold"):
        p = command(
            "hold",
            "lockwarden.cli.hold:hold",
            "Take the lock NAME and keep it in the background, across shell statements.",
            epilog=(
                "Prints shell assignments of LOCKWARDEN_NAME, LOCKWARDEN_TOKEN and\n"
                "LOCKWARDEN_HOLDER (the pid of the process holding the lock), then returns;\n"
                "the holder keeps the lock until it is sent SIGTERM (kill $LOCKWARDEN_HOLDER)\n"
                "or until the shell that started it exits. In a script:\n\n"
                "  held=$(lockwarden hold --wait 60 nightly) || exit\n"
                '  eval "$held"\n'
                "  ...statements run under the lock...\n"
                '  kill "$LOCKWARDEN_HOLDER"\n\n'
                f"{DATABASE}\n\n{EXIT_STATUSES}"
            ),
        )
        _lock_options(p, app="lockwarden-hold")
        p.add_argument(
            "--shell-pid",
            type=_checked(int, lambda v: v > 1, "a process id"),
            metavar="PID",
            help="release when this process exits (default: lockwarden's parent, the shell)",
        )

    if only in (None, "status"):
        p = command(
            "status",
            "lockwarden.cli.status:status",
            "Show the locks held and the requests waiting.",
            epilog="--json prints {format, database, locks: [...], waiters: [...]}, times in\n"
            "seconds; docs/cli.md describes every field. With --watch, --json prints one\n"
            "such object per line (JSON Lines); into a pipe or a file, each look is printed\n"
            "after the last, with its time, as soon as it is made.",
        )
        p.add_argument(
            "prefix", nargs="?", default="", metavar="NAME-PREFIX", help="only names starting so"
        )
        p.add_argument(
            "--watch",
            type=_interval,
            nargs="?",
            const=1.0,
            default=None,
            metavar="SECONDS",
            help="look again every SECONDS (default 1) until Ctrl-C, naming any cycle of "
            "waits; with --json, one object per line",
        )

    if only in (None, "break"):
        p = command(
            "break",
            "lockwarden.cli.admin:break_lock",
            "Remove every holder of NAME (an administrator's override).",
            epilog="The next grant of NAME gets a larger fencing token, so storage that checks\n"
            "tokens turns away the broken holder's late writes. A `lockwarden run` whose lock\n"
            "is broken stops its CMD and exits 70.",
        )
        p.add_argument("name", metavar="NAME")
        p.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")

    if only in (None, "clean"):
        command(
            "clean",
            "lockwarden.cli.admin:clean",
            "Remove expired sessions, their locks, and dead waiters.",
        )

    if only in (None, "permits"):
        p = command(
            "permits",
            "lockwarden.cli.admin:permits",
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
        _force_options(p)

    if only in (None, "init"):
        p = command(
            "init",
            "lockwarden.cli.admin:init",
            "Create or upgrade the store's tables and say where the database is.",
            epilog="With --check nothing is changed: it says which schema version the store has,\n"
            "which this lockwarden has, and which steps an upgrade would apply. The exit\n"
            "status is 69 if this lockwarden cannot use the store. docs/upgrading.md explains\n"
            "rolling upgrades.",
        )
        p.add_argument(
            "--check", action="store_true", help="say what an upgrade would do; change nothing"
        )

    if only in (None, "dashboard"):
        p = command(
            "dashboard",
            "lockwarden.cli.watch:dashboard",
            "Serve a live, read-only web page of the locks, and /metrics for Prometheus.",
            epilog="Needs the dashboard extra: pip install 'lockwarden[dashboard]'. On an address\n"
            "other than loopback it needs a token (--token or $LOCKWARDEN_DASHBOARD_TOKEN),\n"
            "which every request must then carry (?token=... or Authorization: Bearer).\n"
            "docs/monitoring.md describes the page, the metrics and a sample alert.",
        )
        _dashboard_options(p)

    if only in (None, "metrics"):
        p = command(
            "metrics",
            "lockwarden.cli.watch:metrics",
            "Print the store's metrics once, in Prometheus' text format.",
            epilog="For node_exporter's textfile collector; docs/monitoring.md has a cron line.",
        )
        _max_names(p)

    if only in (None, "completion"):
        p = command(
            "completion",
            "lockwarden.cli.generate:completion",
            "Print a shell completion script for lockwarden.",
            epilog='bash: eval "$(lockwarden completion bash)" in ~/.bashrc\n'
            'zsh:  eval "$(lockwarden completion zsh)" in ~/.zshrc',
        )
        p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")

    if only in (None, "manpage"):
        command(
            "manpage",
            "lockwarden.cli.generate:manpage",
            "Print lockwarden's manual page (roff), made from this help.",
            epilog="man -l <(lockwarden manpage); or save it as lockwarden.1 in a man1 directory.",
        )
    return top


def _force_options(p: _Parser) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help="apply a raise at once, beside the current holders (asks; without a terminal "
        "add --yes); otherwise a raise waits for them to leave",
    )
    p.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")


def _dashboard_options(p: _Parser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=_port, default=8080, help="port to listen on (8080)")
    p.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        metavar="TOKEN",
        help="require this token (default $LOCKWARDEN_DASHBOARD_TOKEN, if set)",
    )
    _max_names(p)


def _max_names(p: _Parser) -> None:
    p.add_argument(
        "--max-names",
        type=_checked(int, lambda v: v >= 0, "a whole number >= 0"),
        default=50,
        metavar="N",
        help="lock names with series of their own in the metrics; the rest are summed (50)",
    )


def _lock_options(p: _Parser, app: str) -> None:
    """The options of the commands that take a lock: `run` and `hold`."""
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
    p.set_defaults(mode="write")
    p.add_argument(
        "--wait",
        type=_wait,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the lock, in queue order; 'forever' (or 'inf'): no limit "
        "(default 0: try once)",
    )
    p.add_argument(
        "--ttl",
        type=_positive,
        default=15.0,
        metavar="SECONDS",
        help="the lock is lost this long after the last heartbeat, e.g. if this "
        "process is frozen or killed (default 15; heartbeats every TTL/3)",
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
        default=app,
        metavar="APP",
        help=f"the app id the holder shows in status and in conflict messages (default {app})",
    )


def _parse(argv: list[str]) -> argparse.Namespace:
    """Parse the options; for `run`, CMD is everything after the first ``--``, verbatim.

    argparse itself would take CMD's own options for lockwarden's, and (on
    Python 3.11) drop a second ``--`` that belongs to CMD. Arguments a
    command does not know are reported with that command's name, pointing at
    its own help, not at the top level's.
    """
    top = parser(_named(argv))
    head, cmd = argv, None
    if "--" in argv:
        split = argv.index("--")
        head, cmd = argv[:split], argv[split + 1 :]
    args, extra = top.parse_known_args(head)
    prog = f"lockwarden {args.command}"
    if args.command != "run":
        args, extra = top.parse_known_args(argv)  # there "--" only ends the options, as usual
        if extra:
            raise CliError(
                EX_USAGE,
                f"unrecognized arguments: {' '.join(extra)} (see '{prog} --help')",
                prog,
            )
    else:
        if extra:
            raise CliError(
                EX_USAGE,
                f"unrecognized arguments: {' '.join(extra)} (the command goes after --: "
                "lockwarden run NAME -- CMD [ARGS...])",
                prog,
            )
        if not cmd:
            raise CliError(
                EX_USAGE, "missing the command after --: lockwarden run NAME -- CMD [ARGS...]", prog
            )
        args.cmd = cmd
    for flag in ("json", "verbose", "quiet"):
        setattr(args, flag, getattr(args, flag, False))
    return args


def _named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, if it names one (else every command is declared,
    for the help or the error that lists them)."""
    words = iter(argv)
    for word in words:
        if word in ("--db", "--call-timeout"):
            next(words, None)  # its value, even if it looks like a command
        elif word == "--":
            return None
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _wants_json(argv: Sequence[str]) -> bool:
    """Whether failures are to be JSON: ``--json`` among lockwarden's own arguments."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in own


def executable() -> NoReturn:
    """The ``lockwarden`` executable: `main`, then an exit without the interpreter's teardown.

    When `main` returns, the command has closed its store (its locks
    released, its threads stopped) and said what it had to. A normal exit
    would then tear down every imported module, which costs about as much
    as the command's own work with its lock, and a shell loop pays it on
    every call. So the exit handlers run (lockwarden's release at exit,
    logging's flush: what an exit must do), the streams are flushed, and
    the process ends at once.
    """
    status = main()
    atexit._run_exitfuncs()  # what interpreter shutdown runs first: every atexit handler
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # as in `main`: the reader has seen enough
        status = 128 + 13
    with contextlib.suppress(OSError):  # nowhere left to say anything
        sys.stderr.flush()
    os._exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``lockwarden`` executable; returns the exit status (docs/cli.md lists them)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    as_json = _wants_json(arguments)

    def fail(message: object, status: int, prog: str = "lockwarden") -> int:
        say(message, prog, status=status, as_json=as_json)
        return status

    try:
        args = _parse(arguments)  # --help and --version end here
        if hasattr(args, "call_timeout"):  # read by `open_store`, here and in `hold`'s holder
            os.environ[CALL_TIMEOUT_ENV] = repr(args.call_timeout)
        # What the store logs (a heartbeat retried while the database is away)
        # is worth seeing during a long run: as one line each, like the rest.
        # Set up only if something is logged: importing logging costs every start.
        hooks.on_first_log(partial(_show_logs, verbose=args.verbose, as_json=args.json))
        module, _, function = args.handler.partition(":")
        handler = getattr(importlib.import_module(module), function)
        url = database_url(getattr(args, "db", None)) if module != _GENERATE else ""
        status: int = handler(args, url)
        return status
    except CliError as exc:
        return fail(exc, exc.status, exc.prog)
    except LockUsageError as exc:  # a bad name or app id, found by the store
        return fail(exc, EX_USAGE)
    except LockLost as exc:
        return fail(exc, EX_SOFTWARE)
    except LockError as exc:  # StoreError: the database failed us mid-way
        return fail(exc, EX_UNAVAILABLE)
    except BrokenPipeError:  # `lockwarden status | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # as if killed by SIGPIPE, like other tools in a pipe
    except OSError as exc:
        return fail(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", EX_OSERR)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except Exception as exc:
        return fail(
            f"internal error: {type(exc).__name__}: {exc} (please report this, with the "
            "command that caused it, to the lockwarden developers)",
            EX_SOFTWARE,
        )


def _show_logs(logging: ModuleType, *, verbose: bool, as_json: bool) -> None:
    """Show log records on stderr as lockwarden's own lines, one each (`say`): WARNING and
    above, INFO with --verbose (the administrators' overrides, a heartbeat back).

    A driver's message often spans lines, and a connection pool reconnecting says
    so at every try; lockwarden's own line already names the cause once. So the
    drivers' records below ERROR are shown only with --verbose, and every record,
    its exception included, is folded into one line.
    """

    handler = logging.Handler()
    handler.emit = partial(_say_record, as_json=as_json)  # a Handler's one method to provide
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    if not verbose:
        for driver in ("psycopg", "urllib3", "requests"):
            logging.getLogger(driver).setLevel(logging.ERROR)


def _say_record(record: logging.LogRecord, *, as_json: bool) -> None:
    """One log record as one of lockwarden's lines, its exception (if any) folded in."""
    message = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        message = f"{message}: {type(exc).__name__}: {exc}"
    say(message, as_json=as_json)


_GENERATE = "lockwarden.cli.generate"
"""The module of the commands that describe lockwarden itself and need no database."""
