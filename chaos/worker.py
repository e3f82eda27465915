"""A worker: one OS process of the run, taking locks and incrementing registers.

Run by the controller as ``python -m chaos.worker CONFIG_JSON SLOT INCARNATION``.
Its own store connection, its own session (TTL from the config), its own
random choices (seeded by run seed, slot and incarnation).

In Jepsen's terms a worker plays one *process* at a time: a session and the
operations it performs in turn. When the session is lost, or an operation's
outcome is unknown (a `StoreError`: the database may or may not have done
it), the process is retired — its session closed, as a program would after
such an error — and the worker goes on as a new process with a new session.
A SIGKILL ends the worker; the controller starts a new one in its slot.

Each loop: pick one or two lock names, each read or write; acquire them
(one lock, or a multi-lock); read every register; sometimes sleep inside
the critical section; write each write-locked register plus one and read
each read-locked one again; release. Every step is an operation in the
history: invoke, then ok / fail / info.

A worker stops acting under its locks the moment the library says they are
lost. Its session's ``on_lost`` (`Told`) records a ``lost`` record and sets an
event; the sleep inside the critical section waits on that event, and no
register access is invoked once it is set (the check and the invoke record
are made under the lock ``on_lost`` takes, so an access is either recorded
before the ``lost`` record or never sent). When it stops acting — before its
release, at a refusal by a register, at an error of unknown outcome, or on
being told of the loss — it writes a ``stopped`` record: why, whether it had
been told, and what `Session.lease_left` said then (`chaos.check`, "Holding
intervals"). With ``local_deadline`` off (the control run) the worker
replaces `lockwarden.store.lease.deadline` by one that never comes, so its
sessions are lost only when the database says so, as before the library
kept a deadline of its own.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import math
import mmap
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import lockwarden
from chaos import clock
from chaos.config import Config
from chaos.history import HistoryWriter
from chaos.registers import registers_for
from lockwarden import LockError, LockLost, StoreError
from lockwarden.store import Session, Stamp, Store, lease

T = TypeVar("T")

ACQUIRE_TIMEOUT = 2.5
"""Acquire timeout in TTLs: long enough to outwait a dead holder's lease, short enough to fail
sometimes behind a crowd (failed acquires are operations worth checking too)."""

MULTI_LOCK, READ_MODE = 0.2, 0.35
"""Chance that an operation takes two names at once, and that a name is taken for reading."""

SLEEP_INSIDE = 0.5
"""Chance of sleeping inside the critical section, between the reads and the writes (for at
most `Config.hold` TTLs): the window where a pause makes a holder outlive its lease."""

RECONNECT_PAUSE = 0.5
"""Seconds between attempts to reach the database while it is down (a restart)."""

STALL_GRACE = 1.0
"""Seconds past its timeout after which an acquire's worker dumps its stacks (`StallDumps`)."""


class Board:
    """One byte per worker in a shared file: what each is doing, so the nemesis can aim.

    Pausing or killing a worker that holds a lock, between reading its
    register and writing it, is the fault that tests fencing; picking
    workers blindly would mostly hit them while they wait.
    """

    IDLE, ACQUIRING, HOLDING, MIDWAY, RELEASING = range(5)
    """MIDWAY: holding, registers read, not yet written (or read again). RELEASING: from
    the release's call until it returns (a fault then lands inside the release)."""

    def __init__(self, path: str, slots: int) -> None:
        with open(path, "a+b") as file:
            if os.fstat(file.fileno()).st_size < slots:
                file.truncate(slots)
            self._map = mmap.mmap(file.fileno(), slots)

    def set(self, slot: int, state: int) -> None:
        self._map[slot] = state

    def states(self) -> bytes:
        return self._map[:]


class Retire(Exception):
    """The current process must give up its session (lost, or an outcome is unknown)."""


class Stop(Exception):
    """The library said the session's locks are lost: act no more under them."""


def _finite(seconds: float) -> float | None:
    """A time for the history: None for infinity (no local deadline: the control run)."""
    return seconds if math.isfinite(seconds) else None


def lease_end(session: Session) -> float | None:
    """The session's lease deadline on the monotonic clock (None if it has none).

    `Session.expires_at` converted: it stays the last deadline once the session is
    lost, when `Session.lease_left` says 0. The two clocks are read together; a
    wall clock stepped in between (``--clock-steps``) would show as hours off, and
    gives None instead.
    """
    now, wall = time.monotonic(), time.time()
    left = session.expires_at - wall
    return now + left if math.isfinite(left) and abs(left) < 3600 else None


class Told:
    """A process's ``on_lost``: records when the library said the session was lost, and
    guards every access to a register against coming after that.

    The ``lost`` record is written and the event set under one lock, which
    `acting` takes around its check of the event and the access's invoke record:
    an access is recorded before the ``lost`` record, or refused (`Stop`).
    """

    def __init__(self, history: HistoryWriter, process: str) -> None:
        self.history = history
        self.process = process
        self.session: Session | None = None
        self.event = threading.Event()
        self._lock = threading.Lock()

    def on_lost(self, exc: LockLost) -> None:
        with self._lock:
            if self.event.is_set():
                return
            deadline = None if self.session is None else lease_end(self.session)
            self.history.write(
                "lost", process=self.process, reason=str(exc)[:300], deadline=deadline
            )
            self.event.set()

    @property
    def told(self) -> bool:
        return self.event.is_set()

    @contextlib.contextmanager
    def acting(self) -> Iterator[None]:
        """Around the invoke record of an access under the lock: `Stop` if told already."""
        with self._lock:
            if self.event.is_set():
                raise Stop
            yield

    def sleep(self, seconds: float) -> None:
        """Sleep inside the critical section; `Stop` at once if told meanwhile."""
        if self.event.wait(seconds):
            raise Stop


class Client:
    """One Jepsen process: a session, and its numbered operations recorded as it does them."""

    def __init__(self, history: HistoryWriter, process: str, session: Session) -> None:
        self.history = history
        self.process = process
        self.session = session
        self.holding = False
        """From a grant until its ``stopped`` record."""
        self._ops = 0

    def perform(
        self,
        f: str,
        call: Callable[[], T],
        result: Callable[[T], dict[str, Any]],
        guard: Told | None = None,
        **fields: Any,
    ) -> T:
        """Record ``f`` invoked, run ``call``, record how it ended, and return or raise.

        A `StoreError` (the database did not answer, or not in time) leaves
        the outcome unknown: "info", and the process retires. Any other
        `LockError` is a known failure ("fail"), re-raised for the caller.
        Anything else is a bug: "info", and it ends the worker. With ``guard``
        (an access under a lock), `Stop` instead of the invocation if the
        session was said lost.
        """
        op = {"process": self.process, "op": self._ops + 1, "f": f}
        with guard.acting() if guard is not None else contextlib.nullcontext():
            self.history.write("invoke", **op, **fields)
        self._ops += 1
        try:
            value = call()
        except Exception as exc:
            known = isinstance(exc, LockError) and not isinstance(exc, StoreError)
            self.history.write(
                "fail" if known else "info", **op, error=type(exc).__name__, message=str(exc)[:300]
            )
            if isinstance(exc, StoreError):
                raise Retire(f"{f}: {exc}") from exc
            raise
        self.history.write("ok", **op, **result(value))
        return value


def _nothing(_: object) -> dict[str, Any]:
    return {}


class StallDumps:
    """``--dump-stalls``: where a worker stands when an acquire overruns its timeout.

    Every thread's stack is written by `faulthandler` (its own thread, so a call stuck
    in a driver is caught too) to a file of the worker's own, after a line naming the
    process and the `time.monotonic` at which the acquire began, the clock of the
    history's records. A worker the nemesis paused is dumped as it resumes, wherever
    it was: read each dump beside the history's pause faults.
    """

    def __init__(self, history: str, slot: int) -> None:
        directory = Path(f"{history}.stalls")
        directory.mkdir(exist_ok=True)
        self._file = (directory / f"{slot}-{os.getpid()}.txt").open("a")

    @contextlib.contextmanager
    def watching(self, process: str, seconds: float) -> Iterator[None]:
        """Dump the stacks if the block is still running after ``seconds``."""
        self._file.write(f"== {process} acquire at {time.monotonic():.6f}\n")
        self._file.flush()  # faulthandler writes to the descriptor: keep the order
        faulthandler.dump_traceback_later(seconds, file=self._file)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()


class Worker:
    def __init__(self, config: Config, slot: int, incarnation: int) -> None:
        self.config = config
        self.slot = slot
        self.incarnation = incarnation
        self.rng = random.Random(f"{config.seed}:{slot}:{incarnation}")
        self.history = HistoryWriter(config.history)
        self.board = Board(config.board, config.workers)
        self.parent = os.getppid()
        self.store = self._until_reachable(
            lambda: lockwarden.connect(config.worker_url(slot), durability=config.durability)
        )
        self.registers = registers_for(
            config, self.store, config.application_name(slot), config.worker_url(slot)
        )
        self.stalls = StallDumps(config.history, slot) if config.dump_stalls else None

    def run(self) -> None:
        for n in range(sys.maxsize):
            process = f"{self.slot}.{self.incarnation}.{n}"
            told = Told(self.history, process)
            session = self._until_reachable(
                functools.partial(
                    self.store.session, self.config.app_id, self.config.ttl, told.on_lost
                )
            )
            told.session = session
            self.history.write(
                "process", process=process, slot=self.slot, pid=os.getpid(), session=session.id
            )
            client = Client(self.history, process, session)
            try:
                while True:
                    self._operation(client, told)
            except Retire as why:
                self.history.write("retire", process=process, reason=str(why)[:300])
            self.board.set(self.slot, Board.IDLE)
            with contextlib.suppress(LockError):  # then it no longer beats: its rows expire
                session.close()

    def _until_reachable(self, call: Callable[[], T]) -> T:
        """Call until the database answers (it may be restarting)."""
        while True:
            self._exit_if_orphaned()
            try:
                return call()
            except StoreError:
                time.sleep(RECONNECT_PAUSE)

    def _exit_if_orphaned(self) -> None:
        if os.getppid() != self.parent:  # the controller is gone: stop loading the database
            raise SystemExit(0)

    def _pick(self) -> list[tuple[str, str]]:
        count = 2 if self.rng.random() < MULTI_LOCK else 1
        names = self.rng.sample(self.config.lock_names, count)
        return [(name, "read" if self.rng.random() < READ_MODE else "write") for name in names]

    def _operation(self, client: Client, told: Told) -> None:
        self._exit_if_orphaned()
        items = self._pick()
        timeout = ACQUIRE_TIMEOUT * self.config.ttl
        self.board.set(self.slot, Board.ACQUIRING)
        session = client.session
        watching = (
            contextlib.nullcontext()
            if self.stalls is None
            else self.stalls.watching(client.process, timeout + STALL_GRACE)
        )
        try:
            with watching:
                stamp: Stamp = client.perform(
                    "acquire",
                    (
                        (lambda: session.lock(*items[0], timeout=timeout))
                        if len(items) == 1
                        else (lambda: session.lock_many(items, timeout=timeout))
                    ),
                    lambda s: {"tokens": s.tokens},
                    locks=items,
                )
        except LockLost as exc:
            raise Retire("the session was lost") from exc
        except LockError:
            if len(items) > 1:  # a multi-lock refused must have left nothing held
                names = [name for name, _ in items]
                pending = _settled(session, self.config.ttl)
                client.perform(
                    "held",
                    lambda: _held_by(self.store, session, names),
                    lambda held: {"held": held, "releasing": pending},
                    names=names,
                )
            self.board.set(self.slot, Board.IDLE)
            return
        self.board.set(self.slot, Board.HOLDING)
        client.holding = True
        try:
            if self._critical_section(client, stamp, items, told):
                self._stopped(client, told, "release")
        except Retire:
            self._stopped(client, told, "unknown")
            raise
        self.board.set(self.slot, Board.RELEASING)
        with contextlib.suppress(LockLost):  # recorded: the lock was lost before the release
            client.perform("release", stamp.release, _nothing, names=list(stamp.tokens))
        self.board.set(self.slot, Board.IDLE)
        if session.lost:
            raise Retire("the session was lost")
        time.sleep(self.rng.uniform(0, self.config.think))

    def _critical_section(
        self, client: Client, stamp: Stamp, items: list[tuple[str, str]], told: Told
    ) -> bool:
        """Read every register, maybe sleep, then write (write locks) or read again (read locks);
        whether it ran to its end (else it recorded why it stopped).

        A register that refuses the token means the lock was lost: stop, and
        ask the store (``check``) whether it still counted us as the holder.
        Told that the session was lost (`Told`), it stops at once: the sleep
        ends, and no further access is sent.
        """
        tokens = stamp.tokens
        try:
            values = {name: self._read(client, name, tokens[name], told) for name, _ in items}
            self.board.set(self.slot, Board.MIDWAY)
            if self.rng.random() < SLEEP_INSIDE:
                told.sleep(self.rng.uniform(0, self.config.hold * self.config.ttl))
            for name, mode in items:
                if mode == "write":
                    value = values[name] + 1
                    client.perform(
                        "write",
                        functools.partial(self.registers.write, name, tokens[name], value),
                        _nothing,
                        told,
                        name=name,
                        token=tokens[name],
                        value=value,
                    )
                else:
                    self._read(client, name, tokens[name], told)
        except Stop:
            self._stopped(client, told, "lost")
            return False
        except LockLost:
            self._stopped(client, told, "refused")
            with contextlib.suppress(LockLost):  # recorded: the store agrees the lock was lost
                client.perform("check", stamp.check, _nothing, names=list(tokens))
            return False
        return True

    def _stopped(self, client: Client, told: Told, reason: str) -> None:
        """Record that the process acts no more under its locks, why, and its lease then
        (once a grant: a check after a refusal may yet fail)."""
        if not client.holding:
            return
        client.holding = False
        left = client.session.lease_left
        self.history.write(
            "stopped",
            process=client.process,
            reason=reason,
            told=told.told,
            lease_left=_finite(left),
            deadline=lease_end(client.session),
        )

    def _read(self, client: Client, name: str, token: int, told: Told) -> int:
        return client.perform(
            "read",
            lambda: self.registers.read(name, token),
            lambda value: {"value": value},
            told,
            name=name,
            token=token,
        )


def _settled(session: Session, ttl: float) -> int:
    """Wait up to ``ttl`` for the session's releases retried in the background to be
    confirmed (`Session.releasing`); how many are still pending.

    A refused request whose clean-up met an outage is removed by such a retry, and
    its rows count as held until then: only a look taken with none pending can
    tell that the refusal left something held.
    """
    deadline = time.monotonic() + ttl
    while (pending := session.releasing) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pending


def _held_by(store: Store, session: Session, names: list[str]) -> list[str]:
    """Which of ``names`` the store says ``session`` holds."""
    return sorted(
        {e.name for n in names for e in store.locks(n) if e.holder.session_id == session.id}
    )


def _never(sent: float, ttl: float) -> float:
    """`lockwarden.store.lease.deadline` for the control run: the lease never ends locally."""
    return math.inf


def main(argv: list[str]) -> None:
    config_json, slot, incarnation = argv
    config = Config.from_json(config_json)
    if config.clock_steps:
        clock.install()
    if not config.local_deadline:  # the control run: lost only when the database says so
        lease.deadline = _never
    Worker(config, int(slot), int(incarnation)).run()


if __name__ == "__main__":
    main(sys.argv[1:])
