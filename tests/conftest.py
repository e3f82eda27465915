"""Fixtures for every test that needs a store: a real SQLite file, the real PostgreSQL and MariaDB,
a private etcd cluster.

Every PostgreSQL test gets a schema of its own (``lw_test_<random>``), every
MariaDB test a database of its own, dropped afterwards, so test runs never
see each other's locks.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from etcd3gw.client import Etcd3Client

import lockwarden
from chaos.etcd_cluster import EtcdCluster
from chaos.proxy import Proxy
from lockwarden.store import Session, Store
from lockwarden.store.backends.base import AcquireRequest
from lockwarden.store.backends.mysql.url import mysql_options
from lockwarden.store.backends.sql.base import SQLBackend

PG = os.environ.get("LOCKWARDEN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL = os.environ.get("LOCKWARDEN_TEST_MYSQL", "mysql://root@127.0.0.1:3306")
CHILD = Path(__file__).parent / "store" / "child.py"


def pg_admin() -> psycopg.Connection[Any]:
    return psycopg.connect(PG, autocommit=True)


def open_connections(application_name: str) -> int:
    """How many connections to the test server carry ``application_name``."""
    with pg_admin() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def pg_schema() -> Iterator[str]:
    schema = f"lw_test_{secrets.token_hex(4)}"
    yield schema
    with pg_admin() as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def pg_url(pg_schema: str) -> str:
    return f"{PG}?schema={pg_schema}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'locks.db'}"


def mysql_admin() -> Any:
    """A connection to the test MariaDB server as its administrator (no database chosen)."""
    return pymysql.connect(**mysql_options(MYSQL + "/mysql"), autocommit=True)


@pytest.fixture
def mysql_url() -> Iterator[str]:
    database = f"lw_test_{secrets.token_hex(4)}"
    with mysql_admin() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {database}")
    yield f"{MYSQL}/{database}"
    with mysql_admin() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {database}")


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One 3-member etcd cluster for the whole run (tests that kill members start their own)."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"))
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd_url(etcd_cluster: EtcdCluster) -> Iterator[str]:
    prefix = f"lw_test_{secrets.token_hex(4)}"
    yield etcd_cluster.url(prefix)
    etcd_cluster.delete_prefix(prefix)


URLS = {"sqlite": "sqlite_url", "postgres": "pg_url", "etcd": "etcd_url", "mysql": "mysql_url"}


@pytest.fixture(params=list(URLS))
def url(request: pytest.FixtureRequest) -> str:
    """The URL of a fresh, empty store on each backend."""
    value: str = request.getfixturevalue(URLS[request.param])
    return value


@pytest.fixture
def connect(url: str) -> Iterator[Callable[..., Store]]:
    """Open stores on the test's URL; all are closed at the end."""
    stores: list[Store] = []

    def open_store(**options: Any) -> Store:
        store = lockwarden.connect(url, **options)
        stores.append(store)
        return store

    yield open_store
    for store in stores:
        store.close()


@pytest.fixture
def store(connect: Callable[..., Store]) -> Store:
    return connect()


def empty_locks(store: Store) -> None:
    """Remove every holder, waiter and permit setting of a store (sessions stay)."""
    backend = store._backend
    if isinstance(backend, SQLBackend):
        for table in ("lw_holders", "lw_waiters", "lw_permits"):
            backend.query(f"DELETE FROM {{p}}{table}", write=True)
        return
    member = Etcd3Client(*backend.url.target.split(",")[0].split(":"), api_path="/v3/")
    for kind in "hwop":
        member.delete_prefix(f"{backend.url.schema}/{kind}/")


@dataclass
class Partitionable:
    """A store on a network backend that a test can cut off from one client: ``far`` reaches
    it through freezable proxies (`chaos.proxy`), ``near`` straight."""

    far: str
    near: str
    proxies: list[Proxy]

    def freeze(self) -> None:
        """A partition: nothing between ``far``'s clients and the server crosses or answers."""
        for proxy in self.proxies:
            proxy.freeze()

    def thaw(self) -> None:
        for proxy in self.proxies:
            proxy.thaw()

    def cut(self) -> None:
        """Connections reset and refused, as when the proxy process is killed."""
        for proxy in self.proxies:
            proxy.cut()


NETWORKED = ["postgres", "mysql", "etcd"]


@pytest.fixture(params=NETWORKED)
def partitionable(request: pytest.FixtureRequest) -> Iterator[Partitionable]:
    """A fresh store on each network backend, reachable through proxies and straight."""
    near: str = request.getfixturevalue(URLS[request.param])
    if request.param == "etcd":
        cluster: EtcdCluster = request.getfixturevalue("etcd_cluster")
        proxies = [Proxy(("127.0.0.1", port)) for port in cluster.client_ports]
        far = near.replace(cluster.endpoints, ",".join(p.address for p in proxies))
    else:
        port = 5432 if request.param == "postgres" else 3306
        proxies = [Proxy(("127.0.0.1", port))]
        far = proxies[0].url(near)
    yield Partitionable(far, near, proxies)
    for proxy in proxies:
        proxy.close()


def lease_slack(store: Store) -> float:
    """How much later than its TTL a store may find a silent session dead: etcd counts
    leases in whole seconds and its leader looks for expired ones every half second."""
    return 1.5 if store.url.startswith("etcd:") else 0.0


def enqueue(session: Session, items: dict[str, str], wait: float | None = None) -> str:
    """Queue a request for ``items`` (name: "S" or "X") with no thread waiting on it; its
    request id."""
    request_id = secrets.token_hex(16)
    attempt = session._backend.acquire(
        AcquireRequest(
            session.id, request_id, tuple(items), tuple(items.values()), True, False, wait
        )
    )
    assert attempt.status == "blocked"
    return request_id


def stop_heartbeat(session: Session) -> None:
    """Make a session go silent, as if its process froze (its locks go stale after the TTL):
    neither its heartbeat nor its lease timer runs."""
    session._store._heartbeat.remove(session)
    session._store._leases.remove(session)


def resume_heartbeat(session: Session) -> None:
    """Let a silenced session's heartbeat and lease timer run again, as if its process
    thawed."""
    session._store._heartbeat.add(session)
    session._store._leases.add(session)


class Interrupt(BaseException):
    """What a signal's handler raises in `interrupted_after`, as Ctrl-C raises
    KeyboardInterrupt."""


@contextmanager
def interrupted_after(seconds: float) -> Iterator[None]:
    """Raise `Interrupt` from a SIGALRM handler ``seconds`` into the block, in the main
    thread (where Ctrl-C's KeyboardInterrupt comes); the block must end by it."""

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        with pytest.raises(Interrupt):
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


class Background(threading.Thread):
    """Run a call in a thread; ``result()`` returns its value or raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self._value: Any = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:
            self._error = exc

    def result(self, timeout: float = 30.0) -> Any:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError("background call did not finish")
        if self._error is not None:
            raise self._error
        return self._value


class Child:
    """A separate Python process running ``child.py``, talking JSON lines."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.pid = self.proc.pid
        self._lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()

    def expect(self, timeout: float = 30.0) -> dict[str, Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._lines, timeout):
                raise AssertionError(f"child {self.pid} said nothing for {timeout} s")
            message: dict[str, Any] = json.loads(self._lines.pop(0))
            return message

    def send(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect()

    def finish(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def children() -> Iterator[Callable[..., Child]]:
    started: list[Child] = []

    def spawn(*args: str, env: dict[str, str] | None = None) -> Child:
        child = Child(*args, env=env)
        started.append(child)
        return child

    yield spawn
    for child in started:
        child.kill()


# -- a private PostgreSQL primary and streaming standby (tests/store/failover.py) -----


@pytest.fixture(scope="session")
def pg_failover_template() -> Iterator[Any]:
    """One ``initdb`` for the whole run, copied by every `pg_pair` (skips where Debian's
    PostgreSQL 15 server programs are missing)."""
    from tests.store import failover  # noqa: PLC0415  (only the failover tests need it)

    why = failover.missing()
    if why is not None:
        pytest.skip(why)
    template = failover.Template()
    yield template
    template.close()


@pytest.fixture
def pg_pair(pg_failover_template: Any) -> Iterator[Callable[..., Any]]:
    """Start a private primary and streaming standby (``pg_pair(sync=False)``); all are
    stopped and removed at the end, whatever happened."""
    from tests.store import failover  # noqa: PLC0415

    pairs: list[failover.Pair] = []

    def start(*, sync: bool) -> failover.Pair:
        pair = failover.Pair(pg_failover_template, sync=sync)
        pairs.append(pair)
        return pair

    yield start
    for pair in pairs:
        pair.close()


@pytest.fixture(scope="session")
def mariadb_failover_template() -> Iterator[Any]:
    """One ``mariadb-install-db`` for the whole run, copied by every `mariadb_pair`."""
    from tests.store import failover  # noqa: PLC0415

    why = failover.mariadb_missing()
    if why is not None:
        pytest.skip(why)
    template = failover.MariaTemplate()
    yield template
    template.close()


@pytest.fixture
def mariadb_pair(mariadb_failover_template: Any) -> Iterator[Callable[[], Any]]:
    """Start a private MariaDB primary and replica (``mariadb_pair()``); stopped and removed
    at the end."""
    from tests.store import failover  # noqa: PLC0415

    pairs: list[failover.MariaPair] = []

    def start() -> failover.MariaPair:
        pair = failover.MariaPair(mariadb_failover_template)
        pairs.append(pair)
        return pair

    yield start
    for pair in pairs:
        pair.close()
