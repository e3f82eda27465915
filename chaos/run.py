"""The controller: set up a store, run the workers and the nemesis, end, check.

A run:

1. makes a store of its own (an SQLite file in a temporary directory, a
   PostgreSQL schema ``chaos_<run id>``, or a key prefix of the same name on
   a private etcd cluster that ``python -m chaos`` starts) and writes the
   configuration as the history's first record;
2. starts the workers (``python -m chaos.worker``) and the nemesis, and for
   ``duration`` seconds restarts any worker that dies (a kill by the nemesis
   is expected; any other exit is recorded as a ``crash`` and invalidates
   the run);
3. stops the nemesis, SIGKILLs every worker — the last crash, which leaves
   sessions and locks behind on purpose — waits one TTL and a half second
   (on etcd `LEASE_LATE` more), runs ``Store.clean()`` and records what is
   left (``final``): the locks and waiters (there must be none), and each
   register's value;
then ``python -m chaos`` drops the store and checks the history (`chaos.check`).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import psycopg

import lockwarden
from chaos.config import Config
from chaos.history import HistoryWriter
from chaos.nemesis import Members, Nemesis, Network
from chaos.registers import PlainRegisters, registers_for
from chaos.worker import Board
from lockwarden.store.backends.mysql.url import mysql_options
from lockwarden.store.opening import parse_url

LEASE_RENEWED = {"etcd": 1.0}
"""Seconds a dead session's lease may outlive its TTL because a new leader renewed it: etcd
renews every lease on a leader change, by its election timeout (1 s by default), and the
nemesis kills the leader half the time."""

LEASE_LATE = {"etcd": 1.5 + LEASE_RENEWED["etcd"]}
"""Seconds a dead session may still count as live after its TTL, by backend: on etcd,
leases count whole seconds and the leader looks for expired ones every half second (up to
1.5 s late, the etcd backend's README.md), besides `LEASE_RENEWED`. The final clean waits that much
longer, or it would find live what is only late."""

ROOT = Path(__file__).resolve().parent.parent
"""The directory holding the ``chaos`` package, put on the workers' import path."""

RESTART_DELAY = (0.2, 1.0)
"""Seconds before a dead worker's slot gets a new worker."""

PG_DEFAULT = os.environ.get("LOCKWARDEN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_DEFAULT = os.environ.get("LOCKWARDEN_TEST_MYSQL", "mysql://root@127.0.0.1:3306")


class WorkerPool:
    """The worker processes, one per slot; a worker that dies is replaced."""

    def __init__(self, config: Config, history: HistoryWriter, log: IO[bytes]) -> None:
        self.config = config
        self.history = history
        self._log = log
        self._rng = random.Random(f"{config.seed}:pool")
        self._procs: dict[int, subprocess.Popen[bytes] | None] = {}
        self._incarnations = [0] * config.workers
        self._restart_at: dict[int, float] = {}
        self._killed: set[int] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            for slot in range(self.config.workers):
                self._start(slot)

    def _start(self, slot: int) -> None:
        argv = [sys.executable, "-m", "chaos.worker", self.config.to_json()]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        self._procs[slot] = subprocess.Popen(
            [*argv, str(slot), str(self._incarnations[slot])],
            stdout=self._log,
            stderr=self._log,
            env=env,
        )
        self._incarnations[slot] += 1

    def pid(self, slot: int) -> int | None:
        """The running worker of ``slot``; None while it is being replaced, from the
        moment it was killed (it may not be dead yet: a fault aimed at it would miss)."""
        with self._lock:
            proc = self._procs.get(slot)
            running = proc is not None and slot not in self._killed and proc.poll() is None
            return proc.pid if running and proc is not None else None

    def kill(self, slot: int) -> int | None:
        with self._lock:
            proc = self._procs.get(slot)
            if proc is None or proc.poll() is not None:
                return None
            os.kill(proc.pid, signal.SIGKILL)
            self._killed.add(slot)
            return proc.pid

    def tend(self) -> None:
        """Replace dead workers (after a short delay); record the ones nobody killed."""
        now = time.monotonic()
        with self._lock:
            for slot, proc in self._procs.items():
                if proc is None or proc.poll() is None:
                    continue
                if slot not in self._killed:
                    self.history.write("crash", slot=slot, pid=proc.pid, returncode=proc.returncode)
                self._killed.discard(slot)
                self._procs[slot] = None
                self._restart_at[slot] = now + self._rng.uniform(*RESTART_DELAY)
            for slot, when in list(self._restart_at.items()):
                if when <= now:
                    del self._restart_at[slot]
                    self._start(slot)

    def kill_all(self) -> None:
        with self._lock:
            self._restart_at.clear()
            for proc in self._procs.values():
                if proc is not None and proc.poll() is None:
                    proc.kill()
            for proc in self._procs.values():
                if proc is not None:
                    proc.wait()


def store_url(
    backend: str, run_id: str, directory: Path, pg: str = PG_DEFAULT, mysql: str = MYSQL_DEFAULT
) -> str:
    """A store of the run's own: a file in its directory, a schema or a database named after it."""
    if backend == "sqlite":
        return f"sqlite:///{directory / 'chaos.db'}"
    if backend == "mysql":
        return f"{mysql}/chaos_{run_id}"
    return f"{pg}{'&' if '?' in pg else '?'}schema=chaos_{run_id}"


def _mysql_server(url: str) -> Any:
    """A connection to the MySQL server of a store URL, with no database chosen."""
    import pymysql  # noqa: PLC0415  (only MySQL runs need the driver)

    options = mysql_options(url)
    del options["database"]
    return pymysql.connect(**options, autocommit=True)


def run(
    config: Config,
    log_path: Path,
    members: Members | None = None,
    network: Network | None = None,
) -> None:
    """Run the workers and the nemesis for ``config.duration`` seconds, then record the end.

    ``members``: the etcd cluster's members, for the nemesis to kill, pause and cut off;
    ``network``: the workers' proxies (`config.proxies`), for the nemesis to partition.
    """
    if config.backend == "mysql":
        with _mysql_server(config.url) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {mysql_options(config.url)['database']}")
    with lockwarden.connect(config.url):  # create the tables once, before the crowd arrives
        pass
    if not config.fencing:
        PlainRegisters(config.url).create()
    history = HistoryWriter(config.history)
    history.write("run", config=asdict(config))
    board = Board(config.board, config.workers)
    with open(log_path, "ab") as log:
        pool = WorkerPool(config, history, log)
        nemesis = Nemesis(config, pool, board, history, members, network=network)
        try:
            pool.start()
            nemesis.start()
            deadline = time.monotonic() + config.duration
            while time.monotonic() < deadline and nemesis.failed is None:
                pool.tend()
                time.sleep(0.05)
            nemesis.stop()
        finally:
            pool.kill_all()
        history.write("end")
    if nemesis.failed is not None:
        raise RuntimeError(f"the nemesis failed: {nemesis.failed!r}") from nemesis.failed
    # every session left behind is now stale
    time.sleep(config.ttl + 0.5 + LEASE_LATE.get(config.backend, 0.0))
    _record_final(config, history)
    history.close()


def _record_final(config: Config, history: HistoryWriter) -> None:
    with lockwarden.connect(config.url) as store:
        cleaned = store.clean()
        registers = registers_for(config, store)
        history.write(
            "final",
            cleaned=cleaned._asdict(),
            reclaimed=store.reclaimed_count(),
            locks=[[e.name, e.mode.value, e.token, e.holder.session_id] for e in store.locks()],
            waiters=[[w.name, w.mode.value, w.session_id] for w in store.waiters()],
            registers={name: registers.final(name) for name in config.lock_names},
        )


def drop(config: Config) -> None:
    """Remove the run's PostgreSQL schema or MySQL database (a SQLite file goes with its
    directory)."""
    if config.backend == "mysql":
        with _mysql_server(config.url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {mysql_options(config.url)['database']}")
    if config.backend == "postgres":
        parsed = parse_url(config.url)
        with psycopg.connect(parsed.target, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {parsed.schema} CASCADE")
