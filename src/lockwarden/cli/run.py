"""`lockwarden run NAME -- CMD`: hold a shared lock while a command runs.

The lock is taken before CMD starts and released after CMD ends, whatever
ended it. While CMD runs, four things watch over the lock:

- the store's heartbeat keeps the session alive, and its lease timer calls
  ``on_lost`` when the lease runs out on this host's clock (no heartbeat
  confirmed in time: the database unreachable, or partitioned away) or the
  database says the session is gone;
- a lease guard (`_guard_lease`), which never waits on the database, stops
  CMD once the lease is at risk: SIGTERM when no more than ``--kill-after``
  (at most a quarter of the TTL) is left of it, SIGKILL when it runs out,
  so that CMD has ended before the database can grant the lock to anyone
  else (docs/operators.md, "Partitions");
- a checker asks the database every TTL/3 whether the lock is still held:
  ``lockwarden break`` removes the lock but leaves the session alive, so the
  heartbeat alone would never notice;
- on Linux, CMD gets SIGKILL if lockwarden itself dies (kill -9, the OOM
  killer): nobody would be left to stop it when its lock, no longer
  heartbeating, passes to the next runner after the TTL.

A lost lock stops CMD (SIGTERM, then SIGKILL after ``--kill-after``, or
sooner as the lease runs out) and makes the exit status 70, whatever the
release does afterwards, so the operator learns that CMD's work was cut
short, or may have overlapped with the next holder's.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

from lockwarden import LockError, LockLost, LockTimeout
from lockwarden.cli.common import (
    EX_NOEXEC,
    EX_NOTFOUND,
    EX_SOFTWARE,
    CliError,
    open_store,
)
from lockwarden.cli.progress import Progress
from lockwarden.cli.terminal import say
from lockwarden.store import bounds
from lockwarden.store.lease import MARGIN as LEASE_MARGIN

if TYPE_CHECKING:
    from lockwarden.store import HeldLock, Session, Store

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""Signals that mean "stop": passed on to CMD, whose exit then ends the run."""

KEYBOARD = (signal.SIGINT, signal.SIGQUIT)
"""Signals a terminal sends to its whole foreground process group (Ctrl-C, Ctrl-\\)."""

TIDY_UP = 1.0
"""Seconds a lost session's ending may wait for the database (`session_for`)."""

TERM_BEFORE = 0.25
"""The most (a fraction of the TTL) of a lease at risk that CMD gets between SIGTERM and
the SIGKILL due when the lease runs out: ``--kill-after`` is capped at it. A quarter leaves
a heartbeat that is due (every TTL/3) time to be confirmed before CMD is stopped."""

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class Interrupted(BaseException):
    """A stop signal arrived before CMD started: stop waiting, clean up, exit 128+N.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception``
    on the way swallows it, and the store's waiting loop removes its queue
    entry on the way out.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Job:
    """CMD: started once, given the signals meant for it, stopped if the lock is lost.

    Only the main thread reaps CMD, holding ``_guard``; the other threads
    (heartbeat, checker, kill timer) signal CMD holding it too, so none of
    them signals a pid that has been reaped and may already be someone
    else's. `on_signal` runs on the main thread, possibly while that thread
    holds the guard, so it never takes it.
    """

    def __init__(self, argv: list[str], kill_after: float) -> None:
        self.argv = argv
        self.kill_after = kill_after
        self.lease_end: Callable[[], float] = lambda: math.inf
        """When (``time.monotonic``) the lease runs out: CMD is killed by then (`_hold`)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._armed = False
        self._pending: list[int] = []
        self._guard = threading.Lock()
        self.lost: str | None = None
        """Why the lock was lost (None while it is held)."""
        self.stopped = ""
        """What was done to CMD because of the loss, for the exit message."""

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._armed:
            raise Interrupted(signum)
        proc = self._proc
        if proc is None:
            self._pending.append(signum)  # CMD is being started: it gets it right after
        else:
            _forward(proc, signum)

    def arm(self) -> None:
        """From now on a stop signal is CMD's to act on, not a reason to give up waiting."""
        self._armed = True

    def start(self, env: dict[str, str]) -> None:
        proc = subprocess.Popen(self.argv, env=env, preexec_fn=_die_with_parent())  # noqa: PLW1509  (see _die_with_parent)
        with self._guard:
            self._proc = proc
            lost = self.lost
        if lost is not None:  # lost while CMD was being started
            self._terminate()
        while self._pending:
            _forward(proc, self._pending.pop(0))

    def wait(self) -> int:
        """CMD's exit status, as a shell reports it (128+N if killed by signal N).

        The main thread sleeps in select() on Python's signal wakeup fd, not
        in waitpid(): the kernel may hand a signal for lockwarden to any of
        its threads (it does when the signal arrives while lockwarden is
        stopped), and then only the wakeup fd gets the main thread to run the
        handler, and so pass the signal on, before CMD ends. CMD's end comes
        through the same fd, as SIGCHLD.
        """
        proc = self._proc
        assert proc is not None
        wake, wake_w = os.pipe()
        for fd in (wake, wake_w):
            os.set_blocking(fd, False)
        previous_fd = signal.set_wakeup_fd(wake_w)
        previous_chld = signal.signal(signal.SIGCHLD, _noted)
        try:
            while True:
                with self._guard:
                    status = proc.poll()
                if status is not None:
                    return 128 - status if status < 0 else status
                select.select([wake], [], [])
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 4096)
        finally:
            signal.signal(signal.SIGCHLD, previous_chld)
            signal.set_wakeup_fd(previous_fd)
            os.close(wake)
            os.close(wake_w)

    def stop(self, reason: str) -> None:
        """The lock is lost: stop CMD if it runs. Safe from any thread; the first reason wins."""
        with self._guard:
            if self.lost is not None:
                return
            self.lost = reason
            started = self._proc is not None
        if started:
            self._terminate()

    def _terminate(self) -> None:
        if self.lease_end() <= time.monotonic():  # the lock may be someone else's already
            self.stopped = (
                "CMD was sent SIGKILL at once, the lease having run out"
                if self._send(signal.SIGKILL)
                else "CMD had already ended"
            )
            return
        if not self._send(signal.SIGTERM):
            self.stopped = "CMD had already ended"
            return
        self.stopped = "CMD was sent SIGTERM"
        # A daemon: if CMD ends in time, the process exits without waiting for it.
        threading.Thread(
            target=self._kill, args=(time.monotonic(),), name="lockwarden-kill", daemon=True
        ).start()

    def _kill(self, termed: float) -> None:
        """SIGKILL CMD ``--kill-after`` seconds after SIGTERM, or as the lease runs out if
        that comes first: CMD must have ended before the lock can pass on."""
        while (due := min(termed + self.kill_after, self.lease_end())) > time.monotonic():
            time.sleep(max(0.0, due - time.monotonic()))  # a lease end only moves later
        early = due < termed + self.kill_after
        if self._send(signal.SIGKILL):
            self.stopped = (
                f"CMD was sent SIGTERM, then SIGKILL after {round(due - termed, 1):g} s"
                + " as the lease ran out" * early
            )

    def _send(self, signum: int) -> bool:
        """Signal CMD from any thread but the handler's; False if CMD has been reaped."""
        with self._guard:
            if self._proc is None or self._proc.returncode is not None:
                return False
            with contextlib.suppress(ProcessLookupError):  # reaped by on_signal a moment ago
                os.kill(self._proc.pid, signum)
            return True


def _noted(signum: int, frame: FrameType | None) -> None:
    """A Python handler for SIGCHLD, so that its arrival reaches the wakeup fd."""


def _forward(proc: subprocess.Popen[bytes], signum: int) -> None:
    if signum in KEYBOARD and _terminal_sent_it(proc.pid):
        return
    proc.send_signal(signum)


def _terminal_sent_it(pid: int) -> bool:
    """Whether CMD got this keyboard signal from the terminal already.

    Ctrl-C reaches every process of the terminal's foreground process group,
    CMD included; forwarding it as well would interrupt CMD twice (a Python
    CMD would get a second KeyboardInterrupt in the middle of its clean-up).
    The price: a ``kill -INT`` aimed at lockwarden alone while it runs in the
    foreground of a terminal is not passed on. SIGTERM and SIGHUP always are.
    """
    try:
        tty = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False  # no controlling terminal: nobody but a sender of kill(2)
    try:
        return os.tcgetpgrp(tty) == os.getpgid(pid)
    except OSError:
        return False
    finally:
        os.close(tty)


def _die_with_parent() -> Callable[[], None] | None:
    """What CMD runs before exec on Linux: ask for SIGKILL when lockwarden dies.

    Without it, a lockwarden killed with SIGKILL leaves CMD running with no
    one heartbeating its lock, and after the TTL a second copy may start.
    This is the one thing subprocess cannot do without ``preexec_fn``; the
    function only calls prctl(2) and getppid(2), which are safe in a child
    forked while the heartbeat thread runs. (Other systems: not available.)
    """
    if sys.platform != "linux":
        return None
    import ctypes  # noqa: PLC0415  (Linux only, and only for `run`)

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # lockwarden died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def run(args: argparse.Namespace, url: str) -> int:
    """The `run` command: see the module docstring; returns the exit status."""
    job = Job(args.cmd, args.kill_after)
    try:
        with (
            stop_signals(job.on_signal),
            open_store(url, create=True) as store,
            session_for(args, store, lambda exc: job.stop(str(exc))) as session,
        ):
            try:
                held = take(args, store, session)
            finally:
                job.arm()
            if held is None:
                return int(args.conflict_exit_code)
            return _hold(held, job, args)
    except Interrupted as exc:
        return interrupted(exc, args, "CMD was not started")


@contextmanager
def session_for(
    args: argparse.Namespace, store: Store, on_lost: Callable[[LockLost], None]
) -> Iterator[Session]:
    """The session of `run` and `hold`; a failure to end it is no failure of the command.

    Ending it fails only when the database is away, and then nothing is left
    for the user to act on: its lock was released, or the failed release was
    already reported, and the session expires a TTL after its last heartbeat.
    A lost session's rows count for nothing, so its ending is tidying, and
    waits for an unreachable database no longer than `TIDY_UP`.
    """
    session = store.session(app_id=args.app, ttl=args.ttl, on_lost=on_lost)
    try:
        yield session
    finally:
        with contextlib.suppress(LockError), bounds.within(TIDY_UP if session.lost else math.inf):
            session.close()


@contextmanager
def stop_signals(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Route the stop signals to ``handler`` for the duration; restore them afterwards.

    An ignored signal stays ignored (nohup, background jobs of a script):
    CMD inherits SIG_IGN, as it would without lockwarden in between.
    """
    previous = {}
    for signum in FORWARDED:
        if signal.getsignal(signum) != signal.SIG_IGN:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def interrupted(exc: Interrupted, args: argparse.Namespace, outcome: str) -> int:
    """A stop signal ended the wait for the lock: say so; exit 128+N, as a shell would."""
    name = signal.Signals(exc.signum).name
    status = 128 + exc.signum
    say(
        f"{name} received while taking the lock on {args.name!r}; {outcome}",
        status=status,
        as_json=args.json,
    )
    return status


def take(args: argparse.Namespace, store: Store, session: Session) -> HeldLock | None:
    """Take the lock for `run` or `hold`, showing the wait; None (and a line) if it is busy.

    While the wait lasts, a terminal sees who holds the lock (`Progress`).
    """
    what = f"{args.mode} lock on {args.name!r}"

    def blocker() -> str:
        holders = store.locks(args.name)
        if not holders:
            return "queued behind other waiters"
        return "held by " + ", ".join(str(e.holder) for e in holders)

    started = time.monotonic()
    try:
        with Progress(what, blocker, verbose=args.verbose, quiet=args.quiet or args.json):
            held = session.lock(args.name, args.mode, timeout=args.wait)
    except LockTimeout as exc:
        # Names the holder (app, host, pid, for how long): a notice, as the
        # status may be made 0 by --conflict-exit-code.
        say(exc, status=int(args.conflict_exit_code), as_json=args.json)
        return None
    if args.verbose:
        say(f"took the {what} (token {held.token}) in {time.monotonic() - started:.1f} s")
    return held


def _hold(held: HeldLock, job: Job, args: argparse.Namespace) -> int:
    """Run CMD under ``held``; release it afterwards; CMD's status, or 70 if it was lost."""
    env = {**os.environ, "LOCKWARDEN_NAME": held.name, "LOCKWARDEN_TOKEN": str(held.token)}
    try:
        job.start(env)
    except FileNotFoundError as exc:
        raise CliError(EX_NOTFOUND, f"cannot run {job.argv[0]!r}: command not found") from exc
    except PermissionError as exc:
        raise CliError(EX_NOEXEC, f"cannot run {job.argv[0]!r}: permission denied") from exc
    except (OSError, subprocess.SubprocessError) as exc:
        raise CliError(EX_NOEXEC, f"cannot run {job.argv[0]!r}: {exc}") from exc
    session = held.session
    job.lease_end = lambda: time.monotonic() + session.lease_left
    done = threading.Event()
    watchers = [
        threading.Thread(target=target, args=(held, job, done), name=name, daemon=True)
        for target, name in ((_check, "lockwarden-check"), (_guard_lease, "lockwarden-lease-guard"))
    ]
    for watcher in watchers:
        watcher.start()
    try:
        status = job.wait()
    finally:
        done.set()
        for watcher in watchers:
            watcher.join()
    what = f"{held.mode.word} lock on {held.name!r} (token {held.token})"
    if job.lost is None:
        try:
            held.release()
        except LockLost as exc:  # lost after the last check: CMD's end may have run unprotected
            job.stop(str(exc))
        except LockError as exc:
            # CMD ran to its end under the lock; only the release failed (the
            # database unreachable). The status is CMD's: a caller that retries on
            # failure must not run CMD's work twice. The lock is not held by
            # anyone live: the database lets it go a TTL after the last heartbeat.
            say(
                f"CMD exited with status {status}, but releasing the {what} failed: {exc}; "
                f"the database lets it go {session.ttl:g} s (the TTL) after this "
                "session's last heartbeat",
                as_json=args.json,
            )
            return status
    if job.lost is not None:
        say(
            f"lost the {what} while CMD ran, and {job.stopped}: {job.lost}",
            status=EX_SOFTWARE,
            as_json=args.json,
        )
        # What is left of it (a broken lock's other rows) is given back while the lease lasts.
        with contextlib.suppress(LockError), bounds.within(session.lease_left):
            held.release()
        return EX_SOFTWARE
    if args.verbose:
        say(f"released the {what}; CMD exited with status {status}")
    return status


def _guard_lease(held: HeldLock, job: Job, done: threading.Event) -> None:
    """Stop CMD before its lock can pass on: SIGTERM once no more than ``--kill-after``
    (at most `TERM_BEFORE` of the TTL) is left of a lease that no heartbeat renewed, and
    SIGKILL when it runs out (`Job._kill`). Asks nothing of the database, so no
    partition holds it up: the lease is judged on this host's clock (`Session.lease_left`)."""
    session = held.session
    warning = min(job.kill_after, session.ttl * TERM_BEFORE)
    while not done.wait(max(0.0, session.lease_left - warning)):
        left = session.lease_left
        if left <= warning:
            unconfirmed = session.ttl * (1 - LEASE_MARGIN) - left
            job.stop(
                f"no heartbeat was confirmed for {unconfirmed:.1f} s (is the database "
                f"reachable?), so CMD was stopped before the lease (TTL {session.ttl:g} s) "
                "could run out"
            )
            return


def _check(held: HeldLock, job: Job, done: threading.Event) -> None:
    """Ask the database every TTL/3 whether the lock is still ours (it may have been broken)."""
    while not done.wait(held.session.ttl / 3):
        try:
            held.check()
        except LockLost as exc:
            if not held.session.lost:  # a lost session is reported by on_lost, with its reason
                job.stop(str(exc))
            return
        except LockError:
            continue  # unreachable database: the heartbeat's lease decides when it is a loss
