"""`lockwarden hold NAME`: a lock held across shell statements, like flock's descriptor form.

``run`` holds a lock for one command; a script that wants it across several
statements runs ``hold``, which takes the lock in a background process, prints
shell assignments (the name, the fencing token, the holder's pid), and
returns at once::

    held=$(lockwarden hold --wait 60 nightly) || exit
    eval "$held"
    ...                              # under the lock; $LOCKWARDEN_TOKEN fences writes
    kill "$LOCKWARDEN_HOLDER"        # release (or just let the shell exit)

The holder is forked before anything is opened (a heartbeat thread does not
survive a fork), waits for the lock, reports through a pipe, and then keeps
the lock until it gets SIGTERM, SIGINT or SIGHUP, or until the shell that
started it exits: a script that dies half-way does not leave its lock held.
It starts a session of its own, so the terminal's Ctrl-C and hang-up reach
the shell's foreground job, not the holder. If the lock is lost (broken by an
administrator, or the database unreachable for a TTL) the holder says so on
stderr and exits 70; the statements already running cannot be stopped, which
is what the fencing token is for.

The shell is lockwarden's parent process: ``$(...)`` runs a single command in
place of the subshell in bash, dash and zsh. ``--shell-pid $$`` names it
where that is not so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shlex
import sys
import threading
from types import FrameType

from lockwarden import LockError, LockLost
from lockwarden.cli.common import EX_SOFTWARE, JSON_FORMAT, open_store
from lockwarden.cli.run import Interrupted, interrupted, session_for, stop_signals, take
from lockwarden.cli.terminal import say


def hold(args: argparse.Namespace, url: str) -> int:
    """The `hold` command; in the caller, the exit status of taking the lock."""
    shell = args.shell_pid or os.getppid()
    sys.stdout.flush()
    sys.stderr.flush()
    report_r, report_w = os.pipe()
    child = os.fork()
    if child:
        os.close(report_w)
        return _report(args, child, report_r)
    os.close(report_r)
    os.setsid()
    # stdout belongs to the caller's $(...): keeping it open would keep the
    # caller waiting for as long as the lock is held.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    return _holder(args, url, shell, report_w)


def _report(args: argparse.Namespace, child: int, report: int) -> int:
    """In the caller: print what the holder got, or end with the holder's status."""

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):  # it has just ended by itself
            os.kill(child, signum)  # the holder gives up waiting, cleanly

    with stop_signals(forward), os.fdopen(report, "rb") as pipe:
        line = pipe.readline()
    if not line:  # the holder failed, and said why on stderr
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code  # killed by signal N: 128+N, as shells say
    got = json.loads(line)
    if args.json:
        print(json.dumps({"format": JSON_FORMAT, **got}, indent=2))
        return 0
    shown = {
        "LOCKWARDEN_NAME": got["name"],
        "LOCKWARDEN_TOKEN": got["token"],
        "LOCKWARDEN_HOLDER": got["holder"],
    }
    assignments = "; ".join(f"{n}={shlex.quote(str(v))}" for n, v in shown.items())
    print(f"{assignments}; export {' '.join(shown)}")
    return 0


def _holder(args: argparse.Namespace, url: str, shell: int, report: int) -> int:
    """In the background process: take the lock, report it, keep it until told to stop."""
    stop = threading.Event()
    lost: list[str] = []
    watched = _watch(shell)

    armed = threading.Event()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        if not armed.is_set():
            raise Interrupted(signum)  # still waiting: give up, leaving no queue entry
        stop.set()

    try:
        with (
            stop_signals(on_stop),
            open_store(url, create=True) as store,
            session_for(args, store, lambda exc: _lose(lost, str(exc), stop)) as session,
        ):
            try:
                held = take(args, store, session)
            finally:
                armed.set()
            if held is None:
                return int(args.conflict_exit_code)
            got = {"name": held.name, "token": held.token, "holder": os.getpid()}
            os.write(report, (json.dumps(got) + "\n").encode())
            os.close(report)
            what = f"{held.mode.word} lock on {held.name!r} (token {held.token})"
            while not stop.wait(min(1.0, held.session.ttl / 3)):
                if _ended(watched, shell):
                    break
                try:
                    held.check()
                except LockLost as exc:
                    _lose(lost, str(exc), stop)
                except LockError:
                    continue  # unreachable database: the heartbeat's lease decides
            if not lost:
                try:
                    held.release()
                except LockLost as exc:  # broken (or its session lost) since the last look
                    lost.append(str(exc))
            if lost:
                say(f"lost the {what}: {lost[0]}", status=EX_SOFTWARE, as_json=args.json)
                return EX_SOFTWARE
            if args.verbose:
                say(f"released the {what}")
            return 0
    except Interrupted as exc:
        return interrupted(exc, args, "nothing is held")


def _lose(lost: list[str], reason: str, stop: threading.Event) -> None:
    if not lost:
        lost.append(reason)
    stop.set()


def _watch(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux), immune to pid reuse."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _ended(watched: int | None, pid: int) -> bool:
    if watched is not None:
        return bool(select.select([watched], [], [], 0)[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
