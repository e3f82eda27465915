"""A private PostgreSQL primary and streaming standby, for failover tests.

`Template` runs ``initdb`` once (per test session) into a stopped data
directory; each `Pair` copies it twice — a cold copy of a cleanly stopped
cluster is a base backup — starts one copy as the primary and the other,
with ``standby.signal`` and a ``primary_conninfo``, as its streaming
standby, on free loopback ports, with their sockets in their own data
directories. The machine's own server (5432) is never touched.

Replication is asynchronous, or synchronous (``synchronous_standby_names``
naming the standby, ``synchronous_commit = on``: a commit waits for the
standby to flush it). A failover is `Pair.kill_primary` — every process of
the primary's server killed with SIGKILL, so its connections close at once —
or `Pair.fence_primary` — the primary left running but cut off from the
clients by a frozen proxy (`chaos.proxy`, a partition) — followed by
`Pair.promote`. `Pair.hold_back` stops the primary's WAL sender with SIGSTOP:
what commits after it never reaches the standby (stopping the standby's WAL
receiver instead would not do: what the sender already wrote would wait in
the receiver's socket and be read as it resumed).

Clients reach the pair by libpq's multi-host URL (`Pair.url`), with
``target_session_attrs=read-write``: the standby turns them away until it is
promoted, and a dead primary refuses them, so every new connection lands on
whichever server is the primary.

Run as root, the servers run as the ``postgres`` user (``runuser``); their
directories are made by `tempfile` outside pytest's private temporary tree,
which that user could not enter. Everything is stopped and removed by
`Pair.close` (and `Template.close`), whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from chaos.proxy import Proxy
from lockwarden import LockLost

BIN = Path(os.environ.get("LOCKWARDEN_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
"""Where ``initdb``, ``pg_ctl`` and ``postgres`` are (Debian's ``postgresql-15``)."""

USER = "postgres"
"""Who runs the servers when the tests run as root (PostgreSQL refuses to run as root)."""

CONF = """
listen_addresses = '127.0.0.1'
max_connections = 60
shared_buffers = 16MB
wal_level = replica
max_wal_senders = 4
wal_keep_size = 64MB
hot_standby = on
hot_standby_feedback = on
wal_receiver_status_interval = 1s
wal_retrieve_retry_interval = 200ms
fsync = off
full_page_writes = off
autovacuum = off
dynamic_shared_memory_type = mmap
log_min_messages = warning
log_line_prefix = '%m [%p] '
"""
"""Appended to each server's postgresql.conf. ``fsync = off``: a server here dies by
SIGKILL, never with the machine, so what it wrote is in the kernel's cache anyway,
and whether a commit reaches the standby depends on replication alone. Dynamic
shared memory in the data directory (``mmap``): a killed server cannot remove its
segments, and POSIX ones would stay in /dev/shm after the directory is gone."""


def missing() -> str | None:
    """Why private servers cannot be started here (None if they can)."""
    for program in ("initdb", "pg_ctl", "postgres"):
        if not (BIN / program).exists():
            return f"needs PostgreSQL 15's server programs in {BIN} (Debian's postgresql-15)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(USER)
        except KeyError:
            return f"run as root, needs the {USER!r} user to run the servers as"
        if shutil.which("runuser") is None:
            return "run as root, needs runuser (util-linux) to run the servers as postgres"
    return None


def _as_server_user(args: list[str]) -> list[str]:
    return ["runuser", "-u", USER, "--", *args] if os.geteuid() == 0 else args


def _give_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam(USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)
        for parent, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                os.chown(os.path.join(parent, name), entry.pw_uid, entry.pw_gid)


def _scratch() -> str | None:
    """Where the data directories go: memory (``/dev/shm``) where there is one, as a copy
    there takes a twentieth of the time it takes on this machine's disk."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run(args: list[str], timeout: float = 60.0) -> str:
    done = subprocess.run(
        _as_server_user(args), capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    """Whether ``pid`` is still a process (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class Told:
    """An ``on_lost`` that records when it was called and with what."""

    at: list[float] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    event: threading.Event = field(default_factory=threading.Event)

    def __call__(self, exc: LockLost) -> None:
        self.at.append(time.monotonic())
        self.why.append(str(exc))
        self.event.set()


class Template:
    """One ``initdb``, stopped: the data directory every server of the test session copies."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lw-failover-", dir=_scratch()))
        os.chmod(self.root, 0o755)
        self.data = self.root / "template"
        self.data.mkdir(mode=0o700)
        _give_to_server_user(self.root)
        _run(
            [
                str(BIN / "initdb"),
                "--no-sync",
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--locale=C",
                "--wal-segsize=1",
                "-D",
                str(self.data),
            ],
            timeout=120,
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(CONF)
        # Started and stopped once, so that its control file records these settings (a
        # standby refuses to start with fewer connections than its primary had).
        once = Server(self.data, "template")
        once.start()
        _run([str(BIN / "pg_ctl"), "stop", "-m", "fast", "-w", "-D", str(self.data)])

    def copy(self, name: str) -> Path:
        """A copy of the template, beside it, owned by the server's user."""
        target = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))
        os.chmod(target, 0o755)
        _give_to_server_user(target)
        data = target / "data"
        subprocess.run(["cp", "-a", str(self.data), str(data)], check=True)  # owners kept
        return data

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class Server:
    """One PostgreSQL server on a data directory of its own."""

    def __init__(self, data: Path, name: str) -> None:
        self.data = data
        self.name = name
        self.port = free_port()
        self.log = data.parent / "server.log"

    def conf(self, text: str) -> None:
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(text)

    def start(self) -> None:
        # The log goes beside the data directory, which the server's user owns too.
        _run(
            [
                str(BIN / "pg_ctl"),
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                f"-p {self.port} -k {self.data} -c cluster_name={self.name}",
            ]
        )

    @property
    def dsn(self) -> str:
        """A connection straight to this server (for the test's own looks)."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def admin(self, timeout: int = 5) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=timeout)

    def value(self, sql: str, *args: Any) -> Any:
        with self.admin() as conn:
            cur = conn.execute(sql, args)
            row = cur.fetchone() if cur.description else None
        return None if row is None else row[0]

    def pid(self) -> int | None:
        """The postmaster's pid, while it runs."""
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except (FileNotFoundError, PermissionError):
            return None
        return int(first) if first.strip().isdigit() else None

    def processes(self) -> list[int]:
        """The postmaster and its children."""
        top = self.pid()
        if top is None:
            return []
        found = [top]
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == top:
                found.append(int(entry))
        return found

    def child(self, title: str) -> int:
        """The pid of the server's child process whose title holds ``title`` (e.g.
        ``walsender``)."""
        for pid in self.processes()[1:]:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if title in cmdline:
                return pid
        raise AssertionError(f"{self.name}: no {title} process")

    def kill(self) -> None:
        """SIGKILL to the postmaster and every child at once: a crash of the server's
        machine as its clients see it (their connections are closed by the kernel)."""
        pids = self.processes()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.005)
        # A killed postmaster may linger as a zombie (where nothing reaps orphans), whose
        # pid the next start would take for a live server's: its lock files go.
        for lock in (self.data / "postmaster.pid", *self.data.glob(".s.PGSQL.*.lock")):
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    def stop(self) -> None:
        """Stopped (immediate) if running; every process gone."""
        if self.pid() is None:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            _run([str(BIN / "pg_ctl"), "stop", "-m", "immediate", "-D", str(self.data)], 30)
        self.kill()  # whatever is left (a stopped WAL sender, say)


class Pair:
    """A primary and its streaming standby (asynchronous or synchronous replication)."""

    def __init__(self, template: Template, *, sync: bool) -> None:
        self.sync = sync
        self.primary = Server(template.copy("primary"), "primary")
        self.standby = Server(template.copy("standby"), "standby")
        self.proxy: Proxy | None = None
        self.promoted_in: float | None = None
        """Seconds `promote` took (``pg_ctl promote -w``)."""
        self._stopped: list[int] = []
        try:
            self.primary.conf(
                "synchronous_standby_names = 'standby'\nsynchronous_commit = on\n" if sync else ""
            )
            self.primary.start()
            self.standby.conf(
                f"primary_conninfo = 'host=127.0.0.1 port={self.primary.port} "
                "user=postgres application_name=standby'\n"
            )
            (self.standby.data / "standby.signal").touch()
            _give_to_server_user(self.standby.data.parent)
            self.standby.start()
            self.wait_streaming()
        except BaseException:
            self.close()
            raise

    # -- for clients --------------------------------------------------------------

    def url(self, schema: str, *, through_proxy: bool = False, **params: str) -> str:
        """The store URL of both servers, the primary first: libpq's multi-host form,
        read-write sessions only. ``through_proxy``: the primary is reached through a
        freezable proxy (`fence_primary`)."""
        first = self.primary.port
        if through_proxy:
            if self.proxy is None:
                self.proxy = Proxy(("127.0.0.1", self.primary.port))
            first = self.proxy.port
        query = "&".join(
            [
                "target_session_attrs=read-write",
                *(f"{key}={value}" for key, value in params.items()),
                f"schema={schema}",
            ]
        )
        return f"postgresql://postgres@127.0.0.1:{first},127.0.0.1:{self.standby.port}/postgres?{query}"

    # -- replication --------------------------------------------------------------

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Until the standby streams from the primary (and, if synchronous, is the
        synchronous one)."""
        want = "sync" if self.sync else "async"
        deadline = time.monotonic() + timeout
        while True:
            state = self.primary.value(
                "SELECT state || '/' || sync_state FROM pg_stat_replication"
                " WHERE application_name = 'standby'"
            )
            if state == f"streaming/{want}":
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the standby does not stream ({state})")
            time.sleep(0.02)

    def wait_replayed(self, timeout: float = 10.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        target = self.primary.value("SELECT pg_current_wal_insert_lsn()::text")
        deadline = time.monotonic() + timeout
        while True:
            behind = self.standby.value(
                "SELECT pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_replay_lsn())", target
            )
            if behind is not None and behind <= 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the standby is {behind} bytes behind")
            time.sleep(0.01)

    def hold_back(self) -> None:
        """Stop the primary's WAL sender (SIGSTOP), after the standby has caught up: what
        commits from now on stays on the primary (with synchronous replication, a commit
        waits for the standby, for ever)."""
        self.wait_replayed()
        pid = self.primary.child("walsender")
        os.kill(pid, signal.SIGSTOP)
        self._stopped.append(pid)

    # -- failover -----------------------------------------------------------------

    def kill_primary(self) -> None:
        self.primary.kill()

    def fence_primary(self) -> None:
        """A partition between the clients and the primary (their proxy frozen); the
        primary keeps running, and its standby no longer hears from it once promoted."""
        assert self.proxy is not None, "fencing needs the URL through_proxy"
        self.proxy.freeze()

    def promote(self) -> float:
        """Promote the standby (``pg_ctl promote -w``); the seconds it took."""
        began = time.monotonic()
        _run([str(BIN / "pg_ctl"), "promote", "-w", "-t", "60", "-D", str(self.standby.data)])
        self.promoted_in = time.monotonic() - began
        return self.promoted_in

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        for server in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                server.stop()
            shutil.rmtree(server.data.parent, ignore_errors=True)


# -- MariaDB: a primary and a replica ------------------------------------------------

MARIADB_USER = "mysql"


def mariadb_missing() -> str | None:
    """Why private MariaDB servers cannot be started here (None if they can)."""
    for program in ("mariadbd", "mariadb-install-db"):
        if shutil.which(program) is None:
            return f"needs the MariaDB server programs ({program}: Debian's mariadb-server)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(MARIADB_USER)
        except KeyError:
            return f"run as root, needs the {MARIADB_USER!r} user to run the servers as"
    return None


def _give_to(path: Path, user: str) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", f"{user}:", str(path)], check=True)


class MariaTemplate:
    """One ``mariadb-install-db``: the data directory every MariaDB server copies."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lw-mariadb-", dir=_scratch()))
        os.chmod(self.root, 0o755)
        self.data = self.root / "template"
        user = [f"--user={MARIADB_USER}"] if os.geteuid() == 0 else []
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                *user,
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def copy(self, name: str) -> Path:
        target = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))
        os.chmod(target, 0o755)
        subprocess.run(["cp", "-a", str(self.data), str(target / "data")], check=True)
        _give_to(target, MARIADB_USER)
        return target

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class MariaServer:
    """One ``mariadbd`` (binary log on, so that a replica can become a primary)."""

    def __init__(self, root: Path, server_id: int) -> None:
        self.root = root
        self.server_id = server_id
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        user = [f"--user={MARIADB_USER}"] if os.geteuid() == 0 else []
        self.proc = subprocess.Popen(
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={self.root / 'data'}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.root / 'sock'}",
                f"--pid-file={self.root / 'pid'}",
                f"--log-error={self.root / 'error.log'}",
                f"--server-id={self.server_id}",
                f"--log-bin={self.root / 'data' / 'binlog'}",
                "--log-slave-updates",
                "--innodb-buffer-pool-size=16M",
                "--skip-name-resolve",
                *user,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.execute("SELECT 1")
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mariadbd {self.server_id} did not start") from None
                time.sleep(0.05)

    def connect(self) -> Any:
        import pymysql  # noqa: PLC0415  (only where MariaDB is tested)

        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", connect_timeout=5, autocommit=True
        )

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            cur = conn.cursor()
            cur.execute(sql)
            return list(cur.fetchall() or [])
        finally:
            conn.close()

    def value(self, sql: str) -> Any:
        rows = self.execute(sql)
        return rows[0][0] if rows else None

    def stop(self) -> None:
        """A clean shutdown (the server flushes and closes its files)."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(60)
            self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(30)
            self.proc = None


class Switch(Proxy):
    """A proxy whose target can be moved (a virtual address, a load balancer): clients keep
    one URL, and `point_at` cuts their connections and sends new ones elsewhere."""

    def point_at(self, port: int) -> None:
        self.cut()
        self._target = ("127.0.0.1", port)
        self.restore()


class MariaPair:
    """A MariaDB primary and its replica (asynchronous, GTID), the clients reaching
    whichever is the primary through a `Switch`."""

    def __init__(self, template: MariaTemplate) -> None:
        self.primary = MariaServer(template.copy("primary"), 1)
        self.replica = MariaServer(template.copy("replica"), 2)
        self.switch: Switch | None = None
        try:
            self.primary.start()
            self.primary.execute("CREATE DATABASE locks")
            self.replica.start()
            self.replica.execute(
                f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.primary.port},"
                " MASTER_USER='root', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1"
            )
            self.replica.execute("START SLAVE")
            self.switch = Switch(("127.0.0.1", self.primary.port))
            self.wait_replayed()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        assert self.switch is not None
        return f"mysql://root@127.0.0.1:{self.switch.port}/locks?connect_timeout=2"

    def wait_replayed(self, timeout: float = 20.0) -> None:
        """Until the replica has applied everything the primary has logged."""
        deadline = time.monotonic() + timeout
        while True:
            target = self.primary.value("SELECT @@gtid_binlog_pos")
            if target and self.replica.value(f"SELECT MASTER_GTID_WAIT('{target}', 0.5)") == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the replica did not reach {target}")

    def hold_back(self) -> None:
        """The replica stops fetching from the primary (its I/O thread stopped), after
        catching up: what commits from now on stays on the primary."""
        self.wait_replayed()
        self.replica.execute("STOP SLAVE IO_THREAD")

    def promote(self) -> float:
        """The primary killed, the replica made the primary (replication stopped and
        forgotten), the clients' switch pointed at it: the seconds it took."""
        began = time.monotonic()
        self.primary.kill()
        self.replica.execute("STOP SLAVE")
        self.replica.execute("RESET SLAVE ALL")
        assert self.switch is not None
        self.switch.point_at(self.replica.port)
        return time.monotonic() - began

    def close(self) -> None:
        if self.switch is not None:
            self.switch.close()
        for server in (self.replica, self.primary):
            with contextlib.suppress(Exception):
                server.kill()
            shutil.rmtree(server.root, ignore_errors=True)
