"""The things the store benchmark compares: lockwarden, its peers and the physical floors.

Every subject is driven the same way (`Subject`): ``setup()``, then
``acquire(name)`` / ``release()`` as often as a measure wants, then
``teardown()``. A subject is rebuilt in a child process from its key and the
run's `Env` (`make`), so the multi-process measures need nothing but
picklable values. ``config`` is the one line the README shows about how the
subject is set up: each runs at its library's defaults unless it says
otherwise.
"""

from __future__ import annotations

import importlib
import os
import signal
import sqlite3
import subprocess
import warnings
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar

POSTGRES, REDIS, SQLITE, ETCD, MYSQL = "PostgreSQL", "Redis", "SQLite", "etcd", "MariaDB"
BACKENDS = (POSTGRES, REDIS, SQLITE, ETCD, MYSQL)

HOLD_TIMEOUT = 60.0
"""lockwarden's acquire timeout: far longer than any wait a working lock makes here."""


@dataclass(frozen=True)
class Env:
    """Where one run keeps its state: every name in it carries the run id."""

    run: str
    work_dir: str
    """A directory on disk (not tmpfs) for the SQLite files and lock files."""
    pg_host: str = "127.0.0.1"
    pg_port: int = 5432
    pg_user: str = "postgres"
    pg_db: str = "test"
    redis_url: str = "redis://127.0.0.1:6379/0"
    etcd: str = ""
    """The endpoints (host:port,...) of the run's private etcd cluster; "" if none runs."""
    mysql_url: str = "mysql://root@127.0.0.1:3306"
    """The MariaDB server; each run keeps its tables in a database of its own."""

    @property
    def database(self) -> str:
        """The throwaway MariaDB database of this run."""
        return f"lw_bench_{self.run}"

    def mysql_connect(self, *, database: bool = True) -> Any:
        """An autocommit PyMySQL connection (to the run's database, made on first use)."""
        import pymysql  # noqa: PLC0415  (a test and mysql extra)

        from lockwarden.store.backends.mysql.url import mysql_options  # noqa: PLC0415

        options = mysql_options(f"{self.mysql_url}/{self.database}")
        del options["database"]
        conn = pymysql.connect(**options, autocommit=True)
        if database:
            conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {self.database}")
            conn.select_db(self.database)
        return conn

    @property
    def schema(self) -> str:
        """The throwaway PostgreSQL schema of this run (lockwarden's tables and the floor's)."""
        return f"lw_bench_{self.run}"

    def pg_url(self, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        base = f"postgresql://{self.pg_user}@{self.pg_host}:{self.pg_port}/{self.pg_db}"
        return f"{base}?{query}" if query else base

    def via(self, port: int) -> Env:
        """The same run, reaching PostgreSQL through another port (the round-trip counter)."""
        return replace(self, pg_port=port)

    def variant(self, tag: str) -> Env:
        """Another store location of the same run (another schema, another directory), so
        that a measure which fills a table leaves the others' tables alone."""
        return replace(self, run=f"{self.run}{tag}", work_dir=os.path.join(self.work_dir, tag))

    def file(self, name: str) -> str:
        """A file of this run, in its directory (made on first use)."""
        os.makedirs(self.work_dir, exist_ok=True)
        return os.path.join(self.work_dir, name.replace("/", "_"))


class Subject(ABC):
    key: ClassVar[str]
    label: ClassVar[str]
    backend: ClassVar[str]
    config: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()
    """Modules that must be importable (bench extras)."""
    is_lock: ClassVar[bool] = True
    """False for a floor that only does the writes a lock must do: it cannot be waited on,
    so the handoff and throughput measures leave it out."""
    is_floor: ClassVar[bool] = False

    def __init__(self, env: Env) -> None:
        self.env = env

    @classmethod
    def missing(cls) -> str | None:
        """Why this subject cannot run here, or None."""
        for module in cls.needs:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                return f"{module} is not importable ({exc}): pip install -e '.[bench]'"
        return None

    def setup(self) -> None:  # noqa: B027  (most subjects need nothing more than __init__)
        """Open connections; everything slow that is not part of acquire/release."""

    @abstractmethod
    def acquire(self, name: str) -> None:
        """Take the exclusive lock ``name``, waiting as long as it takes."""

    @abstractmethod
    def release(self) -> None:
        """Release the lock taken last."""

    def teardown(self) -> None:  # noqa: B027
        """Close what setup opened."""

    def warm_up(self, name: str) -> None:
        """Pay what a process's first lock and first wait cost, before a measure's clock
        starts: take and release the lock ``name`` (its own). A subject whose first wait
        sets something up (a connection to be told on) waits once too."""
        self.acquire(name)
        self.release()

    def counters(self) -> dict[str, int]:
        """The subject's own statement counters, if it keeps any."""
        return {}


class CachedLocks(Subject):
    """A peer whose locks are objects: one per name, made once (as a program would keep it)."""

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self._locks: dict[str, Any] = {}
        self._held: Any = None

    @abstractmethod
    def new_lock(self, name: str) -> Any: ...

    def acquire(self, name: str) -> None:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = self.new_lock(name)
        lock.acquire()
        self._held = lock

    def release(self) -> None:
        self._held.release()


# -- lockwarden ---------------------------------------------------------------------------


class Lockwarden(Subject):
    label = "lockwarden"
    durability = "durable"

    FILL_CHUNK = 5000

    @classmethod
    def missing(cls) -> str | None:
        try:
            from lockwarden import connect  # noqa: F401, PLC0415
        except ImportError:
            return "lockwarden.connect is not importable yet (the store is not merged)"
        return super().missing()

    @abstractmethod
    def url(self) -> str: ...

    def setup(self) -> None:
        import lockwarden  # noqa: PLC0415  (may be missing: see `missing`)

        self.store = lockwarden.connect(self.url(), durability=self.durability)
        self.session = self.store.session(app_id="bench")
        self._fill_holder: Any = None  # the session holding what `fill` took
        self._filled = 0

    def acquire(self, name: str) -> None:
        self._held = self.session.lock(name, timeout=HOLD_TIMEOUT)

    def release(self) -> None:
        self._held.release()

    def teardown(self) -> None:
        self.store.close()

    def warm_up(self, name: str) -> None:
        """Also wait once, so that the store's wake-ups (PostgreSQL's LISTEN connection,
        MySQL's doorbell, SQLite's poller) run before the clock, as the hand-off floor's
        LISTEN connection is opened in its setup."""
        super().warm_up(name)
        self.wait_once(f"{name}/gate")

    def wait_once(self, gate: str) -> None:
        """Wait for the lock ``gate`` (briefly: another session of the store holds it)."""
        import lockwarden  # noqa: PLC0415

        with self.store.session(app_id="bench-gate") as other:
            held = other.lock(gate)
            try:
                self.session.lock(gate, timeout=0.05)
            except lockwarden.LockTimeout:
                pass
            else:
                raise RuntimeError(f"{gate} was free: the store did not wait")
            held.release()

    def counters(self) -> dict[str, int]:
        stats = self.store.stats
        return {key: stats[key] for key in ("statements", "attempts", "waits", "handed")}

    def fill(self, total: int, *, same_session: bool) -> None:
        """Hold ``total`` locks in all besides the measured ones (the flatness measure's
        background): in another session, or in the measuring session itself. They are
        taken through the public API, in all-or-nothing batches."""
        if self._fill_holder is None:
            self._fill_holder = (
                self.session if same_session else self.store.session(app_id="bench-filler")
            )
        while self._filled < total:
            upto = min(total, self._filled + self.FILL_CHUNK)
            items = [(f"other/{i}", "write") for i in range(self._filled, upto)]
            if self._fill_holder.try_lock_many(items) is None:
                raise RuntimeError("the fill's locks were busy: is another run using the schema?")
            self._filled = upto


class LockwardenPostgres(Lockwarden):
    key = "lockwarden-pg"
    backend = POSTGRES
    needs = ("psycopg",)
    config = (
        "`lockwarden.connect(postgresql://…?schema=<run schema>)`, durable (the server's "
        "`synchronous_commit=on`); one session (TTL 15 s), `s.lock(name, timeout=60)`, "
        "`held.release()`"
    )

    def url(self) -> str:
        return self.env.pg_url(schema=self.env.schema)


class LockwardenRelaxed(LockwardenPostgres):
    key = "lockwarden-pg-relaxed"
    label = "lockwarden, relaxed"
    durability = "relaxed"
    config = (
        'as above with `durability="relaxed"` (the opt-in of `connect(durability=...)`: '
        "lock transactions commit with `synchronous_commit=off`)"
    )


class LockwardenSQLite(Lockwarden):
    key = "lockwarden-sqlite"
    backend = SQLITE
    config = (
        "`lockwarden.connect(sqlite:///<file>)` on a local ext4 file: WAL, "
        "`synchronous=FULL`; one session, `s.lock(name, timeout=60)`, `held.release()`"
    )

    def url(self) -> str:
        return f"sqlite:///{self.env.file('lockwarden.db')}"


class LockwardenSQLiteRelaxed(LockwardenSQLite):
    key = "lockwarden-sqlite-relaxed"
    label = "lockwarden, relaxed"
    durability = "relaxed"
    config = (
        'as above with `durability="relaxed"` (grants and releases commit with '
        "`synchronous=NORMAL`: a power loss may forget them, never repeat a token)"
    )

    def url(self) -> str:
        return f"sqlite:///{self.env.file('lockwarden-relaxed.db')}"


class LockwardenEtcd(Lockwarden):
    key = "lockwarden-etcd"
    backend = ETCD
    needs = ("etcd3gw",)
    config = (
        "`lockwarden.connect(etcd://<3 members>/<run prefix>)`: a private 3-member cluster of "
        "Debian's etcd 3.4 on loopback; one session (TTL 15 s), `s.lock(name, timeout=60)`, "
        "`held.release()`"
    )

    def url(self) -> str:
        return f"etcd://{self.env.etcd}/lw_bench_{self.env.run}"


# -- PostgreSQL ---------------------------------------------------------------------------


class Psycopg(Subject):
    needs = ("psycopg",)

    def setup(self) -> None:
        import psycopg  # noqa: PLC0415

        self.conn = psycopg.connect(self.env.pg_url(), autocommit=True)

    def teardown(self) -> None:
        self.conn.close()


class PostgresFloor(Psycopg):
    key = "pg-floor"
    label = "floor: 2 write transactions"
    backend = POSTGRES
    is_lock = False
    is_floor = True
    config = (
        "psycopg 3, one autocommit connection: `INSERT` a row (name, token) then "
        "`DELETE` it, each its own durable transaction (one round trip, one WAL flush)"
    )

    def setup(self) -> None:
        super().setup()
        self.table = f"{self.env.schema}.bench_floor"
        self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.env.schema}")
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} (name text PRIMARY KEY, token bigint)"
        )
        self._insert = f"INSERT INTO {self.table} (name, token) VALUES (%s, %s)"
        self._delete = f"DELETE FROM {self.table} WHERE name = %s"
        self._token = 0

    def acquire(self, name: str) -> None:
        self._token += 1
        self.conn.execute(self._insert, (name, self._token))
        self._name = name

    def release(self) -> None:
        self.conn.execute(self._delete, (self._name,))


class PostgresAdvisory(Psycopg):
    key = "pg-advisory"
    label = "pg_advisory_lock pair"
    backend = POSTGRES
    is_floor = True
    config = (
        "psycopg 3, one autocommit connection: `SELECT pg_advisory_lock(key)` / "
        "`pg_advisory_unlock(key)` (session-level, nothing written, no WAL flush)"
    )

    def acquire(self, name: str) -> None:
        self._key = zlib.crc32(name.encode())
        self.conn.execute("SELECT pg_advisory_lock(%s)", (self._key,))

    def release(self) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))


class PostgresHandoffFloor(Psycopg):
    key = "pg-handoff-floor"
    label = "floor: durable grant on release"
    backend = POSTGRES
    is_floor = True
    config = (
        "psycopg 3, the least a durable lock that grants on release must do: a queue table "
        "and two PL/pgSQL functions, each one durable transaction under the name's advisory "
        "lock. `take` queues and says whether it is first (committing without waiting for "
        "the disk if it is not: only a grant must be durable); `give` deletes its row and "
        "notifies the next in line, who LISTENs on a connection of its own, in the "
        "waiting thread, and holds the lock when the notification comes"
    )

    _SETUP = (
        "CREATE TABLE IF NOT EXISTS {s}.handoff_floor"
        " (name text, id text, seq bigserial, PRIMARY KEY (name, id))",
        "CREATE INDEX IF NOT EXISTS handoff_floor_line ON {s}.handoff_floor (name, seq)",
        """CREATE OR REPLACE FUNCTION {s}.handoff_take(n text, me text) RETURNS boolean
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtext(n));
            INSERT INTO {s}.handoff_floor (name, id) VALUES (n, me);
            IF (SELECT id FROM {s}.handoff_floor WHERE name = n ORDER BY seq LIMIT 1) = me THEN
                RETURN true;
            END IF;
            PERFORM set_config('synchronous_commit', 'off', true);  -- only queued
            RETURN false;
        END $$""",
        """CREATE OR REPLACE FUNCTION {s}.handoff_give(n text, me text) RETURNS void
        LANGUAGE plpgsql AS $$
        DECLARE next_id text;
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtext(n));
            DELETE FROM {s}.handoff_floor WHERE name = n AND id = me;
            SELECT id INTO next_id FROM {s}.handoff_floor WHERE name = n ORDER BY seq LIMIT 1;
            IF next_id IS NOT NULL THEN
                PERFORM pg_notify('handoff_' || next_id, '');
            END IF;
        END $$""",
    )

    def setup(self) -> None:
        import psycopg  # noqa: PLC0415

        super().setup()
        schema = self.env.schema
        self.me = os.urandom(8).hex()
        with self.conn.transaction():  # processes of one measure set up at once
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('handoff floor setup'))")
            self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            for statement in self._SETUP:
                self.conn.execute(statement.replace("{s}", schema))
        self._take = f"SELECT {schema}.handoff_take(%s, %s)"
        self._give = f"SELECT {schema}.handoff_give(%s, %s)"
        self.listen = psycopg.connect(self.env.pg_url(), autocommit=True)
        self.listen.execute(f"LISTEN handoff_{self.me}")

    def acquire(self, name: str) -> None:
        row = self.conn.execute(self._take, (name, self.me)).fetchone()
        self._name = name
        if not (row and row[0]):
            for _ in self.listen.notifies(stop_after=1):  # we are first in line now
                pass

    def release(self) -> None:
        self.conn.execute(self._give, (self._name, self.me))

    def teardown(self) -> None:
        self.listen.close()
        super().teardown()


class Tooz(CachedLocks):
    key = "tooz-pg"
    label = "tooz, postgresql driver"
    backend = POSTGRES
    needs = ("tooz.drivers.pgsql",)
    config = (
        "`tooz.coordination.get_coordinator('postgresql://…')`, `get_lock(name)`, "
        "`acquire()` / `release()`: by its design each acquire opens a new psycopg2 "
        "connection and blocks in `pg_advisory_lock`; release unlocks and closes it"
    )

    def setup(self) -> None:
        from tooz import coordination  # noqa: PLC0415

        with warnings.catch_warnings():  # "PostgreSQL driver is deprecated"
            warnings.simplefilter("ignore", DeprecationWarning)
            self.coordinator = coordination.get_coordinator(
                self.env.pg_url(), f"bench-{os.getpid()}".encode()
            )
        self.coordinator.start()

    def new_lock(self, name: str) -> Any:
        return self.coordinator.get_lock(name.encode())

    def teardown(self) -> None:
        self.coordinator.stop()


# -- etcd ---------------------------------------------------------------------------------


class Etcd(Subject):
    backend = ETCD
    needs: ClassVar[tuple[str, ...]] = ("etcd3gw",)

    def member(self) -> Any:
        from etcd3gw.client import Etcd3Client  # noqa: PLC0415

        host, port = self.env.etcd.split(",")[0].split(":")
        return Etcd3Client(host=host, port=int(port), api_path="/v3/")

    def lock_name(self, name: str) -> str:
        return f"lw-bench/{self.env.run}/{name}"


class EtcdFloor(Etcd):
    key = "etcd-floor"
    label = "floor: 2 etcd writes"
    is_lock = False
    is_floor = True
    config = "etcd3gw, one client: `put` a key, then `delete` it (each one Raft write)"

    def setup(self) -> None:
        self.client = self.member()

    def acquire(self, name: str) -> None:
        self._key = self.lock_name(name)
        self.client.put(self._key, "held")

    def release(self) -> None:
        self.client.delete(self._key)


class EtcdctlLock(Etcd):
    key = "etcdctl-lock"
    label = "etcdctl lock"
    needs = ()
    config = (
        "etcd's own lock recipe from the shell: `etcdctl lock NAME` started per acquire, "
        "holding until its SIGINT (the cost of a process start is part of it)"
    )

    def acquire(self, name: str) -> None:
        self._proc = subprocess.Popen(
            ["etcdctl", "--endpoints", self.env.etcd, "lock", self.lock_name(name)],
            stdout=subprocess.PIPE,
            env={**os.environ, "ETCDCTL_API": "3"},
        )
        assert self._proc.stdout is not None
        if not self._proc.stdout.readline():  # it prints the lock's key once it holds it
            raise RuntimeError(f"etcdctl lock failed (exit {self._proc.wait()})")

    def release(self) -> None:
        self._proc.send_signal(signal.SIGINT)
        self._proc.wait()


class ToozEtcd(CachedLocks):
    key = "tooz-etcd3gw"
    label = "tooz, etcd3gw driver"
    backend = ETCD
    needs = ("tooz.drivers.etcd3gw",)
    config = (
        "`tooz.coordination.get_coordinator('etcd3+http://…')`, `get_lock(name)`, "
        "`acquire()` / `release()`: a lease per lock, a create-if-absent transaction, and a "
        "watch while it waits"
    )

    def setup(self) -> None:
        from tooz import coordination  # noqa: PLC0415

        host, port = self.env.etcd.split(",")[0].split(":")
        self.coordinator = coordination.get_coordinator(
            f"etcd3+http://{host}:{port}", f"bench-{os.getpid()}".encode()
        )
        self.coordinator.start()

    def new_lock(self, name: str) -> Any:
        return self.coordinator.get_lock(f"{self.env.run}-{name}".encode())

    def teardown(self) -> None:
        self.coordinator.stop()


# -- Redis --------------------------------------------------------------------------------


class Redis(CachedLocks):
    backend = REDIS
    needs: ClassVar[tuple[str, ...]] = ("redis",)

    def setup(self) -> None:
        import redis  # noqa: PLC0415

        self.redis = redis.Redis.from_url(self.env.redis_url)
        self.redis.ping()

    def teardown(self) -> None:
        self.redis.close()

    def redis_key(self, name: str) -> str:
        return f"lw-bench:{self.env.run}:{name}"


class RedisPy(Redis):
    key = "redis-py"
    label = "redis-py Lock"
    config = (
        "`redis.Redis().lock(name, timeout=30)`: `SET NX PX` to acquire, a Lua script to "
        "release; a waiter polls every 0.1 s (its default `sleep`)"
    )

    def new_lock(self, name: str) -> Any:
        return self.redis.lock(self.redis_key(name), timeout=30)


class PythonRedisLock(Redis):
    key = "python-redis-lock"
    label = "python-redis-lock"
    needs = ("redis", "redis_lock")
    config = (
        "`redis_lock.Lock(redis, name, expire=30)`: `SET NX EX` to acquire, a Lua script "
        "to release that also pushes a signal; a waiter blocks in `BLPOP` (no polling)"
    )

    def new_lock(self, name: str) -> Any:
        import redis_lock  # noqa: PLC0415

        return redis_lock.Lock(self.redis, self.redis_key(name), expire=30)


# -- SQLite and local files ---------------------------------------------------------------


# -- MariaDB ------------------------------------------------------------------------------


class LockwardenMySQL(Lockwarden):
    key = "lockwarden-mysql"
    backend = MYSQL
    needs = ("pymysql",)
    config = (
        "`lockwarden.connect(mysql://…/<run database>)` (PyMySQL), durable "
        "(`innodb_flush_log_at_trx_commit=1`); one session, `s.lock(name, timeout=60)`, "
        "`held.release()`"
    )

    def setup(self) -> None:
        self.env.mysql_connect().close()  # the run's database
        super().setup()

    def url(self) -> str:
        return f"{self.env.mysql_url}/{self.env.database}"


class MySQLFloor(Subject):
    key = "mysql-floor"
    label = "floor: 2 write transactions"
    backend = MYSQL
    is_lock = False
    is_floor = True
    needs = ("pymysql",)
    config = (
        "PyMySQL, one autocommit connection: `INSERT` a row (name, token) then "
        "`DELETE` it, each its own durable InnoDB transaction (one round trip, one log flush)"
    )

    def setup(self) -> None:
        self.conn = self.env.mysql_connect()
        self.cur = self.conn.cursor()
        self.cur.execute(
            "CREATE TABLE IF NOT EXISTS bench_floor (name VARCHAR(512) PRIMARY KEY, token BIGINT)"
            " ENGINE=InnoDB"
        )
        self._token = 0

    def acquire(self, name: str) -> None:
        self._token += 1
        self.cur.execute("INSERT INTO bench_floor VALUES (%s, %s)", (name, self._token))
        self._name = name

    def release(self) -> None:
        self.cur.execute("DELETE FROM bench_floor WHERE name = %s", (self._name,))

    def teardown(self) -> None:
        self.conn.close()


class MySQLGetLock(Subject):
    key = "mysql-get-lock"
    label = "GET_LOCK pair"
    backend = MYSQL
    is_floor = True
    needs = ("pymysql",)
    config = (
        "PyMySQL, one connection: `SELECT GET_LOCK(name, 3600)` / `RELEASE_LOCK(name)` "
        "(a named lock of the connection: nothing written, no lease, no token)"
    )

    def setup(self) -> None:
        self.conn = self.env.mysql_connect(database=False)
        self.cur = self.conn.cursor()

    def acquire(self, name: str) -> None:
        self._name = f"lw-bench:{self.env.run}:{name}"[:64]
        # Not -1 (MySQL's "forever"): MariaDB answers a negative timeout with NULL at once.
        self.cur.execute("SELECT GET_LOCK(%s, 3600)", (self._name,))
        if self.cur.fetchone() != (1,):
            raise RuntimeError(f"GET_LOCK({self._name!r}) was not granted")

    def release(self) -> None:
        self.cur.execute("SELECT RELEASE_LOCK(%s)", (self._name,))
        self.cur.fetchall()

    def teardown(self) -> None:
        self.conn.close()


class ToozMySQL(CachedLocks):
    key = "tooz-mysql"
    label = "tooz, mysql driver"
    backend = MYSQL
    needs = ("tooz.drivers.mysql", "pymysql")
    config = (
        "`tooz.coordination.get_coordinator('mysql://…')` (PyMySQL), `get_lock(name)`, "
        "`acquire()` / `release()`: `GET_LOCK` on a connection of the lock's own"
    )

    def setup(self) -> None:
        from tooz import coordination  # noqa: PLC0415

        self.env.mysql_connect().close()  # the run's database
        self.coordinator = coordination.get_coordinator(
            f"{self.env.mysql_url}/{self.env.database}", f"bench-{os.getpid()}".encode()
        )
        self.coordinator.start()

    def new_lock(self, name: str) -> Any:
        return self.coordinator.get_lock(f"{self.env.run}:{name}".encode())

    def teardown(self) -> None:
        self.coordinator.stop()


class SQLiteFloor(Subject):
    key = "sqlite-floor"
    label = "floor: 2 write transactions"
    backend = SQLITE
    is_lock = False
    is_floor = True
    config = (
        "`sqlite3`, the same kind of file (WAL, `synchronous=FULL`): `INSERT` a row then "
        "`DELETE` it, each its own write transaction"
    )

    def setup(self) -> None:
        self.conn = sqlite3.connect(self.env.file("floor.db"), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS floor (name TEXT PRIMARY KEY, token INTEGER NOT NULL)"
        )
        self._token = 0

    def acquire(self, name: str) -> None:
        self._token += 1
        self.conn.execute("INSERT INTO floor (name, token) VALUES (?, ?)", (name, self._token))
        self._name = name

    def release(self) -> None:
        self.conn.execute("DELETE FROM floor WHERE name = ?", (self._name,))

    def teardown(self) -> None:
        self.conn.close()


class FileLock(CachedLocks):
    key = "filelock"
    label = "filelock"
    backend = SQLITE
    needs = ("filelock",)
    config = (
        "`filelock.FileLock(path)` on a local file: `flock`, nothing written; a waiter "
        "polls every 0.05 s (its default `poll_interval`)"
    )

    def new_lock(self, name: str) -> Any:
        import filelock  # noqa: PLC0415

        return filelock.FileLock(self.env.file(name + ".filelock"))


class Fasteners(CachedLocks):
    key = "fasteners"
    label = "fasteners"
    backend = SQLITE
    needs = ("fasteners",)
    config = (
        "`fasteners.InterProcessLock(path)` on a local file: `fcntl` lock, nothing "
        "written; a waiter polls from 0.01 s backing off to 0.1 s (its defaults)"
    )

    def new_lock(self, name: str) -> Any:
        import fasteners  # noqa: PLC0415

        return fasteners.InterProcessLock(self.env.file(name + ".fasteners"))


SUBJECTS: tuple[type[Subject], ...] = (
    LockwardenPostgres,
    LockwardenRelaxed,
    PostgresFloor,
    PostgresAdvisory,
    PostgresHandoffFloor,
    Tooz,
    RedisPy,
    PythonRedisLock,
    LockwardenMySQL,
    MySQLFloor,
    MySQLGetLock,
    ToozMySQL,
    LockwardenSQLite,
    LockwardenSQLiteRelaxed,
    SQLiteFloor,
    FileLock,
    Fasteners,
    LockwardenEtcd,
    EtcdFloor,
    EtcdctlLock,
    ToozEtcd,
)
BY_KEY = {cls.key: cls for cls in SUBJECTS}


def make(key: str, env: Env) -> Subject:
    """The subject ``key`` of the run ``env`` (in this process or a child)."""
    return BY_KEY[key](env)


def floor_of(backend: str) -> type[Subject] | None:
    """The floor the subjects of ``backend`` are compared to (the write-transaction pair)."""
    return next((c for c in SUBJECTS if c.backend == backend and not c.is_lock), None)
