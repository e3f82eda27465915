"""The nemesis: faults injected at random (from the run's seed) while the workers run.

One fault at a time, a random interval apart (exponential, mean
``fault_every`` seconds), each recorded in the history:

- ``kill`` — SIGKILL a worker (the controller starts a new one in its slot);
- ``pause`` — SIGSTOP a worker for 1.25 to 2.5 TTLs, then SIGCONT: its lease
  runs out while it believes it holds its locks (the fencing case);
- ``terminate`` (PostgreSQL) — ``pg_terminate_backend`` on one worker's
  connections, or every worker's, found by their ``application_name``;
- ``restart`` (PostgreSQL, with ``--allow-restart``) — restart the server,
  the first time half ``restart_every`` into the run, then every
  ``restart_every`` seconds, no more often (others may share the server);
  with ``--crash`` an immediate shutdown, so the server recovers from its
  log and forgets what relaxed durability had not flushed;
- ``member-kill`` (etcd) — SIGKILL one member of the cluster (the leader half
  the time) and start it again 0.5 to 3 s later; ``member-pause`` — SIGSTOP
  one member for 0.5 to 3 s. One member at a time: a majority stays up.
- ``partition`` (PostgreSQL, MariaDB, etcd) — freeze one worker's proxies
  (`chaos.network.WorkerLinks`), or every worker's (three times in ten), for
  1 to 3 TTLs, then ``heal``: a blackhole between the workers and the store,
  nothing crossing, nothing answering, nothing closed. The lone victim is
  aimed at like a kill's. Partitions come `PARTITION_WEIGHT` times as often
  as each other fault: a holder must stop by its own clock (`chaos.check`,
  "Holding intervals");
- ``member-cut`` (etcd) — cut one member (the leader half the time) off from
  the other two, both ways, for 0.5 to 3 s, then ``member-heal``: its peer
  links go through proxies (`chaos.network.PeerLinks`), its clients still
  reach it.
- ``clock-step`` (with ``--clock-steps``) — step one worker's wall clock
  6 hours forward or back (`chaos.clock`); its monotonic clock goes on.
- ``kill-writer`` (SQLite) — SIGKILL a worker *inside* a write transaction.
  It is found by freezing a worker (SIGSTOP), and looking in ``/proc/locks``
  for its exclusive lock on byte 120 of the database's ``-shm`` file, the
  WAL write lock that SQLite holds from ``BEGIN IMMEDIATE`` to the commit.
  Frozen, the worker cannot commit, so the kill lands mid-transaction for
  certain; if it held no write lock it is thawed and another is tried.

Kills and pauses aim at workers that hold locks (mostly between reading
their register and writing it, as `worker.Board` reports): a fault there
is the one that tests fencing and the recovery of a dead holder's locks.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import psycopg

from chaos import clock
from chaos.config import Config
from chaos.history import HistoryWriter
from chaos.worker import Board
from lockwarden.store.backends.mysql.url import mysql_options
from lockwarden.store.opening import parse_url

PAUSE_TTLS = (1.25, 2.5)
"""A pause lasts this many TTLs: always longer than the lease."""

AIMED = 0.8
"""Chance that a kill or pause picks among the workers holding locks, when there are any."""

WRITER_PROBES = 1000
"""At most this many workers frozen and looked at to find one inside a write transaction
(a few seconds; about one probe in fifty finds one)."""

WAL_WRITE_LOCK = 120
"""The byte of SQLite's ``-shm`` file whose exclusive lock is the WAL write lock."""


class Workers(Protocol):
    """What the nemesis needs from the controller's set of worker processes."""

    def pid(self, slot: int) -> int | None:
        """The pid of the worker in ``slot``, None while it is being restarted."""

    def kill(self, slot: int) -> int | None:
        """SIGKILL the worker in ``slot`` and restart it soon; its pid (None if there was none)."""


class Network(Protocol):
    """What the nemesis needs of the workers' proxies (`chaos.network.WorkerLinks`)."""

    def freeze(self, slots: Iterable[int]) -> None: ...

    def thaw(self, slots: Iterable[int]) -> None: ...


class Members(Protocol):
    """What the nemesis needs of an etcd cluster (`chaos.etcd_cluster.EtcdCluster`)."""

    @property
    def size(self) -> int: ...

    @property
    def cuttable(self) -> bool: ...

    def cut(self, i: int) -> None: ...

    def heal(self, i: int) -> None: ...

    def leader(self) -> int: ...

    def kill(self, i: int) -> None: ...

    def start(self, i: int) -> None: ...

    def pause(self, i: int) -> None: ...

    def resume(self, i: int) -> None: ...


MEMBER_DOWN = (0.5, 3.0)
"""Seconds an etcd member stays killed, paused or cut off."""

PARTITION_TTLS = (1.0, 3.0)
"""A partition lasts this many TTLs: from shorter than a lease to well past it."""

PARTITION_ALL = 0.3
"""Chance that a partition cuts every worker off at once, not one."""

PARTITION_WEIGHT = 2
"""How many times as often as each other fault a partition is chosen: with the default
``--fault-every`` of 3 s, about 4 a minute on PostgreSQL."""


def pg_restart_command(*, crash: bool = False) -> list[str]:
    """Restart the local PostgreSQL cluster (the machine's only version, cluster ``main``):
    a fast shutdown, or with ``crash`` an immediate one (no checkpoint: the server
    recovers from its log at the start, as after a power cut)."""
    [version] = os.listdir("/etc/postgresql")
    mode = ["--mode", "immediate"] if crash else []
    return ["pg_ctlcluster", "--skip-systemctl-redirect", *mode, version, "main", "restart"]


class Nemesis(threading.Thread):
    def __init__(
        self,
        config: Config,
        workers: Workers,
        board: Board,
        history: HistoryWriter,
        members: Members | None = None,
        *,
        network: Network | None = None,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.config = config
        self.workers = workers
        self.board = board
        self.history = history
        self.members = members
        self.network = network
        self.rng = random.Random(f"{config.seed}:nemesis")
        self.stopping = threading.Event()
        self.failed: BaseException | None = None
        self._last_restart = time.monotonic() - config.restart_every / 2
        self._faults: dict[str, Callable[[], None]] = {"kill": self.kill, "pause": self.pause}
        if config.backend == "postgres":
            self._faults["terminate"] = self.terminate
        elif config.backend == "mysql":
            self._faults["kill-connections"] = self.kill_connections
        elif config.backend == "sqlite":
            self._faults["kill-writer"] = self.kill_writer
        if config.clock_steps:
            self._faults["clock-step"] = self.clock_step
        if members is not None:
            self._faults["member-kill"] = self.member_kill
            self._faults["member-pause"] = self.member_pause
            if members.cuttable:
                self._faults["member-cut"] = self.member_cut
        if network is not None:
            self._faults["partition"] = self.partition
        self._menu = sorted(self._faults)
        """The faults to choose from, each once, a partition `PARTITION_WEIGHT` times."""
        if network is not None:
            self._menu += ["partition"] * (PARTITION_WEIGHT - 1)

    def stop(self) -> None:
        """Stop after the fault under way (a paused worker is resumed at once)."""
        self.stopping.set()
        self.join()

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.rng.expovariate(1 / self.config.fault_every)):
                self._next_fault()()
        except BaseException as exc:  # the controller reports it: the run is not valid
            self.failed = exc

    def _next_fault(self) -> Callable[[], None]:
        due = time.monotonic() - self._last_restart >= self.config.restart_every
        if self.config.allow_restart and due:  # the first at half the interval, then one each
            return self.restart
        return self._faults[self.rng.choice(self._menu)]

    # -- choosing a victim ------------------------------------------------------------

    def _victim(self, *, aim: bool = True) -> tuple[int, int] | None:
        """A (slot, pid): with ``aim``, mostly one holding locks (midway or releasing, if
        any is)."""
        running = [s for s in range(self.config.workers) if self.workers.pid(s) is not None]
        if not running:
            return None
        states = self.board.states()
        for wanted in ((Board.MIDWAY, Board.RELEASING), (Board.HOLDING,)) if aim else ():
            aimed = [s for s in running if states[s] in wanted]
            if aimed and self.rng.random() < AIMED:
                break
        else:
            aimed = running
        slot = self.rng.choice(aimed)
        pid = self.workers.pid(slot)
        return None if pid is None else (slot, pid)

    def _state(self, slot: int) -> str:
        return ("idle", "acquiring", "holding", "midway", "releasing")[self.board.states()[slot]]

    # -- the faults -----------------------------------------------------------------------

    def kill(self) -> None:
        if (victim := self._victim()) is None:
            return
        slot, _ = victim
        state = self._state(slot)
        if (pid := self.workers.kill(slot)) is not None:
            self.history.write("fault", fault="kill", slot=slot, pid=pid, state=state)

    def pause(self) -> None:
        if (victim := self._victim()) is None:
            return
        slot, pid = victim
        seconds = self.config.ttl * self.rng.uniform(*PAUSE_TTLS)
        state = self._state(slot)
        os.kill(pid, signal.SIGSTOP)
        self.history.write("fault", fault="pause", slot=slot, pid=pid, state=state, seconds=seconds)
        try:
            self.stopping.wait(seconds)
        finally:
            # Gone meanwhile only if something else killed it: the pool records that
            # as a crash, which makes the run invalid, so nothing is hidden here.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.history.write("fault", fault="resume", slot=slot, pid=pid)

    def partition(self) -> None:
        """Cut one worker (mostly one holding locks) or all of them off from the store for
        1 to 3 TTLs, then heal."""
        assert self.network is not None
        if self.rng.random() < PARTITION_ALL:
            slot, pid, slots, state = None, None, list(range(self.config.workers)), None
        elif (victim := self._victim()) is not None:
            (slot, pid), slots, state = victim, [victim[0]], self._state(victim[0])
        else:
            return
        seconds = self.config.ttl * self.rng.uniform(*PARTITION_TTLS)
        self.network.freeze(slots)
        self.history.write(
            "fault",
            fault="partition",
            slot=slot,
            pid=pid,
            slots=slots,
            state=state,
            seconds=seconds,
        )
        try:
            self.stopping.wait(seconds)
        finally:
            self.network.thaw(slots)
            self.history.write("fault", fault="heal", slot=slot, slots=slots)

    def clock_step(self) -> None:
        """Step one worker's wall clock `chaos.clock.STEP` seconds forward or back."""
        if (victim := self._victim()) is None:
            return
        slot, pid = victim
        forward = self.rng.random() < 0.5
        state = self._state(slot)
        with contextlib.suppress(ProcessLookupError):  # it died meanwhile
            os.kill(pid, clock.FORWARD if forward else clock.BACK)
            self.history.write(
                "fault",
                fault="clock-step",
                slot=slot,
                pid=pid,
                state=state,
                seconds=clock.STEP if forward else -clock.STEP,
            )

    def terminate(self) -> None:
        """Drop the PostgreSQL connections of one worker (mostly) or of all of them."""
        everyone = self.rng.random() < 0.3
        slot = self.rng.randrange(self.config.workers)
        pattern = f"{self.config.app_id}-w%" if everyone else self.config.application_name(slot)
        with psycopg.connect(parse_url(self.config.url).target, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name LIKE %s",
                (pattern,),
            ).fetchall()
        self.history.write(
            "fault", fault="terminate", slot=None if everyone else slot, connections=len(rows)
        )

    def kill_connections(self) -> None:
        """KILL one of the run's MySQL connections (mostly) or all of them.

        MySQL connections carry no application name, so a victim is any
        connection to the run's database: a worker's pool, doorbell or heartbeat.
        """
        import pymysql  # noqa: PLC0415  (only MySQL runs need the driver)

        options = mysql_options(self.config.url)
        everyone = self.rng.random() < 0.3
        with pymysql.connect(**options, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT ID FROM information_schema.PROCESSLIST"
                " WHERE DB = %s AND ID <> CONNECTION_ID() ORDER BY ID",
                (options["database"],),
            )
            ids = [row[0] for row in cur.fetchall()]
            victims = ids if everyone or not ids else [self.rng.choice(ids)]
            for conn_id in victims:
                with contextlib.suppress(pymysql.OperationalError):  # gone meanwhile
                    cur.execute(f"KILL {int(conn_id)}")
        self.history.write("fault", fault="kill-connections", connections=len(victims))

    def restart(self) -> None:
        """Restart the PostgreSQL server; the record says how long it took and whether it worked."""
        self._last_restart = time.monotonic()
        self.history.write(
            "fault",
            fault="restart",
            crash=self.config.crash,
            wall=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        )
        done = subprocess.run(
            pg_restart_command(crash=self.config.crash), capture_output=True, text=True, check=False
        )
        self.history.write(
            "fault", fault="restarted", returncode=done.returncode, stderr=done.stderr[-300:]
        )

    def _member(self) -> tuple[int, bool]:
        """An etcd member to hit: the leader half the time."""
        assert self.members is not None
        leader = self.members.leader()
        i = leader if self.rng.random() < 0.5 else self.rng.randrange(self.members.size)
        return i, i == leader

    def member_kill(self) -> None:
        """SIGKILL an etcd member, then start it again (with its data) a little later."""
        assert self.members is not None
        i, leader = self._member()
        self.members.kill(i)
        self.history.write("fault", fault="member-kill", member=i, leader=leader)
        try:
            self.stopping.wait(self.rng.uniform(*MEMBER_DOWN))
        finally:
            self.members.start(i)
            self.history.write("fault", fault="member-start", member=i)

    def member_pause(self) -> None:
        """SIGSTOP an etcd member for a while: it neither answers nor leads meanwhile."""
        assert self.members is not None
        i, leader = self._member()
        self.members.pause(i)
        self.history.write("fault", fault="member-pause", member=i, leader=leader)
        try:
            self.stopping.wait(self.rng.uniform(*MEMBER_DOWN))
        finally:
            self.members.resume(i)
            self.history.write("fault", fault="member-resume", member=i)

    def member_cut(self) -> None:
        """Cut an etcd member off from the other two for a while (its clients still reach it)."""
        assert self.members is not None
        i, leader = self._member()
        self.members.cut(i)
        self.history.write("fault", fault="member-cut", member=i, leader=leader)
        try:
            self.stopping.wait(self.rng.uniform(*MEMBER_DOWN))
        finally:
            self.members.heal(i)
            self.history.write("fault", fault="member-heal", member=i)

    def kill_writer(self) -> None:
        """SIGKILL a worker frozen while it holds SQLite's write lock."""
        shm = parse_url(self.config.url).target + "-shm"
        for probe in range(1, WRITER_PROBES + 1):
            # Not aimed: writes happen while acquiring, in the register, in heartbeats.
            if self.stopping.is_set() or (victim := self._victim(aim=False)) is None:
                return
            slot, pid = victim
            try:
                os.kill(pid, signal.SIGSTOP)
                if _frozen(pid) and _holds_write_lock(pid, shm):
                    self.workers.kill(slot)
                    self.history.write(
                        "fault", fault="kill-writer", slot=slot, pid=pid, probes=probe
                    )
                    return
            except (ProcessLookupError, FileNotFoundError):  # it died, or nobody has the file open
                pass
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopping.wait(self.rng.uniform(0, 0.002))
        self.history.write("fault", fault="kill-writer-missed", probes=WRITER_PROBES)


def _frozen(pid: int) -> bool:
    """Wait (briefly) until ``pid`` is stopped: only then can it not commit behind our back."""
    for _ in range(1000):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rpartition(")")[2].split()[0] == "T":
            return True
        time.sleep(0.0005)
    return False


def _holds_write_lock(pid: int, shm: str) -> bool:
    """Whether ``pid`` holds the WAL write lock (``/proc/locks`` lists POSIX locks with pids).

    The ``-shm`` file is looked up each time: SQLite deletes it when the
    last connection closes, and the next one makes a new one.
    """
    found = os.stat(shm)
    lock_file = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 4242 fe:00:2146468 120 120"
        if fields[1:5] == ["POSIX", "ADVISORY", "WRITE", str(pid)] and fields[5:8] == [
            lock_file,
            str(WAL_WRITE_LOCK),
            str(WAL_WRITE_LOCK),
        ]:
            return True
    return False
