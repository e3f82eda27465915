"""PostgreSQL outages, through a proxy the test cuts (the shared server is never touched).

What must hold: a release that met the outage is not forgotten (the lock is
free once the database is back, while its session lives on); a refused
LISTEN connection slows waiters down (they poll) but fails none, and push
comes back with the connection; "too many clients" is waited out.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import lockwarden
from chaos.proxy import Proxy
from lockwarden import LockTimeout, NotHeld, StoreError
from lockwarden.store.backends.postgresql import connections as pgconn
from lockwarden.store.backends.postgresql.backend import PostgresBackend
from tests.conftest import PG, Background, open_connections, pg_admin, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    params = conninfo_to_dict(PG)
    proxy = Proxy((str(params["host"]), int(params.get("port", 5432))))
    yield proxy
    proxy.close()


def test_a_release_during_an_outage_frees_the_lock_when_the_database_is_back(
    pg_url: str, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgconn, "POOL_WAIT", 1.0)  # fail the release quickly
    with lockwarden.connect(proxy.url(pg_url)) as far, lockwarden.connect(pg_url) as near:
        holder = far.session("holder", ttl=60)
        held = holder.lock("job")
        waiter = near.session("waiter", ttl=60)
        waiting = Background(lambda: waiter.lock("job", timeout=60))
        wait_for(lambda: near.waiters("job"), what="the waiter to queue")
        proxy.cut()
        with pytest.raises(StoreError, match="retried in the background") as caught:
            held.release()
        assert "127.0.0.1" in str(caught.value)
        assert holder.releasing == 1
        with pytest.raises(NotHeld):
            held.release()  # the stamp is no longer the session's
        assert [e.holder.session_id for e in near.locks("job")] == [holder.id]  # still held
        proxy.restore()
        taken = waiting.result(timeout=30)  # the session is still open: the retry freed it
        assert taken.token > held.token
        assert not holder.lost
        wait_for(lambda: holder.releasing == 0, what="the release to be confirmed")
        taken.release()


def test_an_abandoned_wait_during_an_outage_is_cleaned_up_when_the_database_is_back(
    pg_url: str, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgconn, "POOL_WAIT", 1.0)
    with lockwarden.connect(proxy.url(pg_url)) as far, lockwarden.connect(pg_url) as near:
        owner = near.session("owner", ttl=60)
        held = owner.lock("job")
        waiter = far.session("waiter", ttl=60)
        waiting = Background(lambda: waiter.lock("job", timeout=60))
        wait_for(lambda: near.waiters("job"), what="the waiter to queue")
        proxy.cut()
        with pytest.raises(StoreError):
            waiting.result(timeout=60)  # its next attempt meets the outage
        assert waiter.releasing == 1  # its queue entry is still there
        proxy.restore()
        wait_for(lambda: not near.waiters("job"), timeout=30, what="the entry to go")
        assert not waiter.lost
        held.release()


def test_waiters_poll_while_listen_is_refused_and_push_comes_back(
    pg_url: str, proxy: Proxy
) -> None:
    with lockwarden.connect(proxy.url(pg_url)) as far, lockwarden.connect(pg_url) as near:
        backend = far._backend
        assert isinstance(backend, PostgresBackend)
        waiter = far.session("waiter", ttl=60)  # the pool has its connection now
        owner = near.session("owner", ttl=60)
        proxy.refuse_new()  # only the LISTEN connection (and pool growth) is refused
        for _ in range(3):
            held = owner.lock("job")
            waiting = Background(lambda: waiter.lock("job", timeout=30))
            wait_for(lambda: near.waiters("job"), what="the waiter to queue")
            held.release()
            waiting.result().release()  # woken by polling, not failed
            assert not backend.listening
        assert far.stats["listener_reconnects"] >= 1
        proxy.restore()
        wait_for(lambda: backend.listening, timeout=10, what="LISTEN to come back")
        held = owner.lock("job")
        waiting = Background(lambda: waiter.lock("job", timeout=30))
        wait_for(lambda: near.waiters("job"), what="the waiter to queue")
        held.release()
        waiting.result().release()


def test_too_many_clients_is_waited_out(pg_schema: str) -> None:
    """53300 from a role at its connection limit: retried with backoff, not fatal."""
    role = f"lw_test_{secrets.token_hex(4)}"
    params = conninfo_to_dict(PG)
    with pg_admin() as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
        admin.execute(f"GRANT CREATE ON DATABASE {params['dbname']} TO {role}")
    try:
        url = PG.replace("postgres@", f"{role}@", 1) + f"?schema={pg_schema}"
        blocker = psycopg.connect(PG.replace("postgres@", f"{role}@", 1))
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(PG.replace("postgres@", f"{role}@", 1))
        assert "too many connections" in str(refused.value)  # 53300 (libpq gives no code)
        opening = Background(lambda: lockwarden.connect(url))
        time.sleep(0.3)  # its first attempts are refused with 53300...
        blocker.close()  # ...and a retry gets in
        store = opening.result(timeout=30)
        store.close()
    finally:
        with pg_admin() as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {pg_schema} CASCADE")
            admin.execute(f"REVOKE ALL ON DATABASE {params['dbname']} FROM {role}")
            admin.execute(f"DROP ROLE {role}")


def test_a_store_opens_at_most_its_pool_and_a_listener(pg_url: str) -> None:
    """Sixteen threads hammering one store share its bounded pool."""
    app = f"lw_pool_{secrets.token_hex(4)}"
    seen: list[int] = []
    with lockwarden.connect(f"{pg_url}&application_name={app}") as store:
        sessions = [store.session(f"t{i}") for i in range(16)]

        def work(i: int) -> None:
            for _ in range(20):
                with sessions[i].lock(f"n{i % 4}", timeout=30):
                    pass

        workers = [Background(lambda i=i: work(i)) for i in range(16)]
        while any(w.is_alive() for w in workers):
            seen.append(open_connections(app))
            time.sleep(0.05)
        for w in workers:
            w.result()
    assert seen and max(seen) <= pgconn.POOL_SIZE + 1  # the pool, and the LISTEN connection


def test_a_waiter_whose_listen_connection_is_slow_to_come_times_out_on_time(
    pg_url: str, proxy: Proxy
) -> None:
    """The waiter's store opens its LISTEN connection before the first wait, and the
    server takes new connections in without answering (up to the driver's
    connect_timeout, 10 s): the waiter waits for it no longer than its own timeout."""
    with lockwarden.connect(proxy.url(pg_url)) as far, lockwarden.connect(pg_url) as near:
        near.session("holder", ttl=60).lock("job")
        waiter = far.session("waiter", ttl=60)  # its connection is open before the stall
        proxy.stall_new()
        waiting = Background(lambda: waiter.lock("job", timeout=1))
        waiting.join(5)
        assert not waiting.is_alive(), "the waiter overran its timeout"
        with pytest.raises(LockTimeout):
            waiting.result()
        proxy.restore()
