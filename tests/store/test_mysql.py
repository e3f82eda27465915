"""Only on MySQL / MariaDB: doorbell wake-ups, killed connections, a restarted server.

The restart happens to a private MariaDB the test starts in a temporary
directory (its own port and socket), never to the shared server.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

import lockwarden
from lockwarden import LockTimeout, StoreError
from lockwarden.store import Store, inbox
from lockwarden.store.backends.base import AcquireRequest
from lockwarden.store.backends.mysql.backend import (
    DIALECT,
    IDLE_IN_TRANSACTION,
    _socket,
    _tls,
    bucket,
)
from lockwarden.store.backends.mysql.url import mysql_options
from lockwarden.store.backends.sql.queries import (
    CLEAN,
    CLOSE_SESSION,
    DEADLOCK_EDGES,
    IN_THE_WAY,
    RECLAIM_DELETE,
)
from tests.conftest import Background, enqueue, mysql_admin, wait_for
from tests.store.failover import MariaServer, MariaTemplate


def _connections(database: str) -> list[int]:
    with mysql_admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s", (database,))
        return [row[0] for row in cur.fetchall()]


def _kill(ids: list[int]) -> None:
    with mysql_admin() as conn, conn.cursor() as cur:
        for conn_id in ids:
            cur.execute(f"KILL {int(conn_id)}")


def test_the_shared_text_is_rewritten_where_mariadb_differs() -> None:
    assert "AS h" not in DIALECT.render(RECLAIM_DELETE)
    assert "lw_holders.session_id" in DIALECT.render(RECLAIM_DELETE)
    assert "CAST(NULL AS CHAR)" in DIALECT.render(CLEAN[2])
    for sql in (IN_THE_WAY, DEADLOCK_EDGES):  # every parameter is bound, none spliced
        assert "%(session)s" in DIALECT.render(sql) or "%(name)s" in DIALECT.render(sql)


def _token_counter(mysql_url: str) -> int:
    with pymysql.connect(**mysql_options(mysql_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT value FROM lw_meta WHERE `key` = 'token'")
        value: int = cur.fetchone()[0]
        return value


def test_a_free_name_is_granted_in_one_round_trip_and_a_taken_one_takes_no_token(
    mysql_url: str,
) -> None:
    store = lockwarden.connect(mysql_url)
    try:
        holder, other = store.session(app_id="holder"), store.session(app_id="other")
        before = store.stats["statements"]
        lock = holder.lock("free")
        assert store.stats["statements"] - before == 1
        assert lock.token == _token_counter(mysql_url)
        counter = _token_counter(mysql_url)
        with pytest.raises(LockTimeout):
            other.lock("free", timeout=0)
        assert _token_counter(mysql_url) == counter  # the one-round-trip try wrote nothing
        lock.release()
        assert other.lock("free").token == counter + 1
    finally:
        store.close()


def test_only_a_name_fought_over_queues_its_wait_in_the_first_round_trip(mysql_url: str) -> None:
    """A calm name's acquire does not pay for the queueing shortcut; a blocked attempt
    marks the name fought over, and the next wait on it is queued in one round trip;
    a grant found free makes it calm again."""
    store = lockwarden.connect(mysql_url)
    try:
        h, w1, w2 = (store.session(app_id=a) for a in ("h", "w1", "w2"))
        lock = h.lock("job")

        def attempt(session: lockwarden.store.Session) -> tuple[int, Any]:
            before = store.stats["statements"]
            found = store._backend.acquire(
                AcquireRequest(
                    session.id, secrets.token_hex(16), ("job",), ("X",), True, False, 30.0
                )
            )
            return store.stats["statements"] - before, found.rows

        sent, rows = attempt(w1)  # calm: the try, then the full algorithm
        assert sent > 1 and [r["app_id"] for r in rows] == ["h"]
        assert attempt(w2) == (1, None)  # fought over: queued in the first round trip
        assert [w.app_id for w in store.waiters("job")] == ["w1", "w2"]
        lock.release()  # granted to w1
        w1.close()
        w2.close()
        free = h.lock("job")  # found free: calm again
        free.release()
        assert "job" not in store._backend._contended  # type: ignore[attr-defined]
    finally:
        store.close()


def _granted_across_stores(mysql_url: str, releaser: Store, name: str) -> tuple[int, int]:
    """A waiter of another store is granted by ``releaser``'s release, and wakes holding the
    lock well before its own recheck (its holder stays live for 60 s): how often its
    doorbell rang meanwhile, and how many attempts it made after the first."""
    waiter_store = lockwarden.connect(mysql_url)
    try:
        holder = releaser.session(app_id="holder", ttl=60)
        waiter = waiter_store.session(app_id="waiter", ttl=60)
        lock = holder.lock(name)
        got = Background(lambda: waiter.lock(name, timeout=20))
        wait_for(lambda: releaser.waiters(name), what="the waiter to queue")
        wait_for(lambda: waiter_store._backend._listen_conn, what="the doorbell to hang")
        time.sleep(0.2)  # past the look of everyone when the doorbell first hangs
        attempts = waiter_store.stats["attempts"]
        lock.release()
        granted = got.result(timeout=0.5 * inbox.LOOK_EVERY)
        assert [(e.token, e.holder.app_id) for e in releaser.locks(name)] == [
            (granted.token, "waiter")
        ]
        assert granted.token > lock.token
        assert waiter_store.stats["listener_reconnects"] == 0
        with mysql_admin() as conn, conn.cursor() as cur:
            cur.execute(
                f"SELECT rings FROM {mysql_url.rsplit('/', 1)[1]}.lw_doorbells WHERE id = %s",
                (waiter_store._backend._tag,),
            )
            (rings,) = cur.fetchone()
        return rings, waiter_store.stats["attempts"] - attempts
    finally:
        waiter_store.close()


def test_a_grant_on_this_machine_is_poked_not_rung(mysql_url: str) -> None:
    """A release pokes the inbox of a waiter's store on the releaser's machine, with its
    token: the waiter holds the lock when it wakes, and no doorbell rings (no ring, no
    KILL QUERY, no second attempt)."""
    store = lockwarden.connect(mysql_url)
    try:
        assert _granted_across_stores(mysql_url, store, "poked") == (0, 0)
    finally:
        store.close()


def test_a_knock_that_hangs_holds_up_neither_the_release_nor_the_rung_waiter(
    mysql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `KILL QUERY` that interrupts a rung doorbell's sleep is sent by the releasing
    store's knocking thread: while it hangs (held here on purpose, as the server held such
    KILLs for 6-10 s in chaos runs), the release has returned, and the waiter, whose
    doorbell was rung before the knock, wakes holding the lock once the knock lands."""
    store = lockwarden.connect(mysql_url)
    store._backend._near = "another machine/"  # the waiter is rung, not poked
    waiter_store = lockwarden.connect(mysql_url)
    backend: Any = store._backend
    knock, held = backend._knock_now, threading.Event()

    def hanging_knock(who: str, params: dict[str, Any]) -> None:
        held.wait(30)
        knock(who, params)

    monkeypatch.setattr(backend, "_knock_now", hanging_knock)
    try:
        holder = store.session(app_id="holder", ttl=60)
        waiter = waiter_store.session(app_id="waiter", ttl=60)
        waiter_store._backend.look_every = None  # only the doorbell wakes it
        lock = holder.lock("knocked")
        got = Background(lambda: waiter.lock("knocked", timeout=20))
        wait_for(lambda: store.waiters("knocked"), what="the waiter to queue")
        wait_for(lambda: waiter_store._backend._listen_conn, what="the doorbell to hang")
        time.sleep(0.5)  # past the waiter's look at what is in its way (`waiting.PID_POLL`)
        started = time.monotonic()
        lock.release()
        assert time.monotonic() - started < 1.0  # not behind the knock
        time.sleep(0.3)
        assert got.is_alive()  # rung, and asleep until knocked
        held.set()
        granted = got.result(timeout=0.5 * inbox.LOOK_EVERY)
        assert [e.holder.app_id for e in store.locks("knocked")] == ["waiter"]
        assert granted.token > lock.token
        assert store.stats["rings_unheard"] == 0
    finally:
        held.set()
        waiter_store.close()
        store.close()


def test_closing_a_store_sends_the_knocks_asked_before_it(
    mysql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close` waits for the knocking thread to send what was asked of it (up to 5 s), so a
    process that releases and exits at once still interrupts the rung doorbells."""
    store = lockwarden.connect(mysql_url)
    backend: Any = store._backend
    sent: list[str] = []

    def slow_knock(who: str, params: dict[str, Any]) -> None:
        time.sleep(0.3)
        sent.append(who)

    monkeypatch.setattr(backend, "_knock_now", slow_knock)
    backend._knock("TRUE", {})
    backend._knock("FALSE", {})
    store.close()
    assert sent == ["TRUE", "FALSE"]


def test_a_grant_to_another_machine_rings_its_doorbell(mysql_url: str) -> None:
    """A waiter of another machine is rung, and finds its grant by attempting."""
    store = lockwarden.connect(mysql_url)
    store._backend._near = "another machine/"
    try:
        rings, attempts = _granted_across_stores(mysql_url, store, "rung")
        assert (rings, attempts) == (1, 1)
    finally:
        store.close()


def test_a_poke_that_cannot_be_sent_rings_instead(
    mysql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter of this machine whose store's inbox cannot be reached (gone, or full) is
    rung after the release commits, as a waiter of another machine is."""
    store = lockwarden.connect(mysql_url)
    monkeypatch.setattr(store._backend._outbox, "poke", lambda session, request, tokens: False)
    try:
        assert _granted_across_stores(mysql_url, store, "unpoked") == (1, 1)
    finally:
        store.close()


def test_a_release_grants_the_head_of_the_queue_itself(mysql_url: str) -> None:
    """The release lets the waiter in within its own transaction: nobody attempts for the
    queued request after it queued, yet it holds the lock once the release returns."""
    store = lockwarden.connect(mysql_url)
    try:
        with store.session(app_id="first") as s, store.session(app_id="next") as w:
            held = s.lock("handed")
            enqueue(w, {"handed": "X"})  # which marks the name fought over here
            attempts, before = store.stats["attempts"], store.stats["statements"]
            held.release()
            # The first request; the token and the grant; the dequeue; whether the grantee
            # waits for anything else; the ring with the commit.
            assert store.stats["statements"] - before == 5
            granted = [(e.holder.app_id, e.token > held.token) for e in store.locks("handed")]
            assert granted == [("next", True)]
            assert store.waiters("handed") == []
            assert store.stats["attempts"] == attempts
    finally:
        store.close()


def test_a_grant_never_waits_for_the_bucket_of_a_multi_locks_other_name(
    mysql_url: str,
) -> None:
    """Taken out of bucket order, the other names' bucket rows are only taken if free at
    once: with one held by another transaction, the release leaves the multi-lock queued
    (for its own attempt) instead of waiting, and grants it when the row is free."""
    store = lockwarden.connect(mysql_url)
    try:
        with store.session(app_id="first") as s, store.session(app_id="both") as w:
            held = s.lock("a")
            names = ("a", next(n for n in (f"b{i}" for i in range(99)) if bucket(n) != bucket("a")))
            queued = AcquireRequest(
                w.id, secrets.token_hex(16), names, ("X", "X"), True, False, None
            )
            assert store._backend.acquire(queued).status == "blocked"
            other = pymysql.connect(**mysql_options(mysql_url))
            try:
                with other.cursor() as cur:  # another transaction holds the second bucket
                    cur.execute("START TRANSACTION")
                    cur.execute(
                        "SELECT id FROM lw_buckets WHERE id = %s FOR UPDATE", (bucket(names[1]),)
                    )
                    started = time.monotonic()
                    held.release()
                    assert time.monotonic() - started < 5  # no lock wait (InnoDB's is 50 s)
                    assert store.locks() == []
                    assert {e.name for e in store.waiters()} == set(names)
            finally:
                other.rollback()
                other.close()
            assert store._backend.acquire(queued).status == "granted"  # its own attempt
    finally:
        store.close()


def test_killed_connections_are_replaced_and_the_doorbell_rehung(mysql_url: str) -> None:
    """KILL every connection of both stores (pool, doorbell listener): locks, waits
    and wake-ups carry on, through retries and a reconnected listener."""
    database = mysql_url.rsplit("/", 1)[1]
    holder_store, waiter_store = lockwarden.connect(mysql_url), lockwarden.connect(mysql_url)
    try:
        holder = holder_store.session(app_id="holder", ttl=60)
        waiter = waiter_store.session(app_id="waiter", ttl=60)
        lock = holder.lock("job")
        got = Background(lambda: waiter.lock("job", timeout=30))
        wait_for(lambda: holder_store.waiters("job"), what="the waiter to queue")
        # The waiter queues first and hangs its doorbell next: kill the listener too.
        wait_for(lambda: waiter_store._backend._listen_conn, what="the doorbell to hang")
        _kill(_connections(database))
        wait_for(lambda: waiter_store.stats["listener_reconnects"] >= 1, what="a reconnect")
        lock.check()  # the session survived its connections
        lock.release()
        assert got.result().token > lock.token
        assert holder_store.stats["retries"] >= 1
    finally:
        holder_store.close()
        waiter_store.close()


def test_a_doorbell_that_cannot_hang_at_first_slows_waiters_and_fails_none(
    mysql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener's first connection is lost: waiters poll at its retries (as on
    PostgreSQL without LISTEN) instead of failing with a `StoreError`."""
    store = lockwarden.connect(mysql_url)
    backend = store._backend
    connect = backend._connect
    failed: list[str] = []

    def lost_once() -> Any:
        if threading.current_thread().name == "lockwarden-doorbell" and not failed:
            failed.append("lost")
            raise backend._driver.OperationalError(2013, "Lost connection to server")
        return connect()

    monkeypatch.setattr(backend, "_connect", lost_once)
    try:
        holder, waiter = store.session(app_id="h"), store.session(app_id="w")
        lock = holder.lock("job")
        got = Background(lambda: waiter.lock("job", timeout=30))
        wait_for(lambda: failed, what="the doorbell's first try")
        lock.release()
        assert got.result().token > lock.token
        assert store.stats["listener_reconnects"] >= 1
    finally:
        store.close()


def test_a_connection_killed_inside_an_acquire_leaves_nothing_half_done(mysql_url: str) -> None:
    """A transaction cut by KILL is rolled back by the server and retried whole."""
    database = mysql_url.rsplit("/", 1)[1]
    store = lockwarden.connect(mysql_url)
    try:
        session = store.session(app_id="a")
        for i in range(20):
            if i % 3 == 0:
                _kill(_connections(database))
            with session.lock(f"n{i % 4}", timeout=5):
                pass
        assert store.locks() == []
        assert store.waiters() == []
    finally:
        store.close()


# -- a private server, restarted -------------------------------------------------


@pytest.fixture
def private_server(mariadb_failover_template: MariaTemplate) -> Iterator[MariaServer]:
    """A MariaDB of this test's own, with a database ``locks``."""
    server = MariaServer(mariadb_failover_template.copy("restart"), 1)
    server.start()
    server.execute("CREATE DATABASE locks")
    yield server
    server.kill()


@pytest.mark.slow
def test_locks_and_tokens_survive_a_server_restart(private_server: MariaServer) -> None:
    """Grants are durable: after a restart the holder still holds, its session is
    still live (the heartbeat reconnects), and tokens go on rising. (A waiter
    woken while the server is down meets the outage as a `StoreError`, as on
    PostgreSQL, so the waiter here queues after the restart.)"""
    url = f"mysql://root@127.0.0.1:{private_server.port}/locks"
    store: Store = lockwarden.connect(url)
    other: Store = lockwarden.connect(url)
    try:
        holder = store.session(app_id="holder", ttl=30)
        waiter = other.session(app_id="waiter", ttl=30)
        lock = holder.lock("job")

        private_server.stop()
        time.sleep(0.5)
        private_server.start()

        lock.check()  # still ours: the grant was on disk
        assert [entry.token for entry in store.locks("job")] == [lock.token]
        got = Background(lambda: waiter.lock("job", timeout=60))
        wait_for(lambda: store.waiters("job"), what="the waiter to queue")
        lock.release()
        assert got.result().token > lock.token
    finally:
        store.close()
        other.close()


def test_a_release_grants_nothing_to_a_session_closing_meanwhile(mysql_url: str) -> None:
    """A session closes, and before the close commits a release grants to it (on what was
    committed): the grant finds the waiter's queue entry gone once the close commits,
    takes the grant back and lets the next in line in. (Had the close not deleted the
    session's holder rows yet, its deletion and the grant would deadlock, and InnoDB's
    victim would be retried.)"""
    store = lockwarden.connect(mysql_url)
    try:
        with (
            store.session(app_id="h") as h,
            store.session(app_id="w") as w,
            store.session(app_id="next") as nxt,
        ):
            held = h.lock("race")
            for queued in (w, nxt):
                enqueue(queued, {"race": "X"})
            close = pymysql.connect(**mysql_options(mysql_url))
            try:
                cur = close.cursor()
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                cur.execute("BEGIN")
                for statement in CLOSE_SESSION:
                    cur.execute(DIALECT.render(statement), {"session": w.id})
                releasing = Background(held.release)

                with mysql_admin() as admin, admin.cursor() as look:

                    def release_waits() -> bool:
                        look.execute(
                            "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                            " WHERE INFO LIKE 'DELETE FROM lw_waiters WHERE request_id%%'"
                            " AND DB = %s",  # not another test's, running beside this one
                            (mysql_url.rsplit("/", 1)[1],),
                        )
                        return bool(look.fetchone()[0])

                    wait_for(release_waits, what="the release's grant to wait for the close")
                close.commit()
            finally:
                close.close()
            releasing.result()
            holders = [(e.holder.session_id, e.token > held.token) for e in store.locks("race")]
            assert holders == [(nxt.id, True)]
            with pymysql.connect(**mysql_options(mysql_url)) as conn, conn.cursor() as raw:
                raw.execute("SELECT session_id FROM lw_holders WHERE name = 'race'")
                assert [row[0] for row in raw.fetchall()] == [nxt.id]
    finally:
        store.close()


def _signal_taken(pid: int, signum: int) -> bool:
    """Whether ``signum`` sent to ``pid`` is no longer pending: its handler's flag is set."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = {
        k: int(v, 16)
        for k, v in (line.split(":\t") for line in status.splitlines())
        if k in ("SigPnd", "ShdPnd")
    }
    return not any(mask & (1 << (signum - 1)) for mask in pending.values())


def test_ctrl_c_during_a_statement_is_a_keyboard_interrupt(mysql_url: str) -> None:
    """A lock call waits inside the server (another transaction holds the name's bucket
    row) when Ctrl-C comes; the driver's call goes on until the server answers, and the
    interrupt is raised between the driver's reads, leaving the connection midway. It
    reaches the caller as KeyboardInterrupt, and the lock is given back. (The driver's
    cursor used to read on as it closed, and "Commands out of sync" came out as a
    `StoreError` in its place.)"""
    lockwarden.connect(mysql_url).close()  # the tables
    code = (
        "import os, sys, lockwarden\n"
        "store = lockwarden.connect(sys.argv[1])\n"
        "s = store.session(app_id='sigint')\n"
        "s.lock('warm').release()\n"
        "print('ready', flush=True)\n"
        "try:\n"
        "    s.lock('stuck', timeout=60)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', len(store.locks('stuck')), flush=True)\n"
        "    os._exit(0)\n"
    )
    with pymysql.connect(**mysql_options(mysql_url)) as blocker, blocker.cursor() as cur:
        cur.execute(f"SELECT id FROM lw_buckets WHERE id = {bucket('stuck')} FOR UPDATE")
        child = subprocess.Popen(
            [sys.executable, "-c", code, mysql_url], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            database = mysql_url.rsplit("/", 1)[1]

            def waits_in_the_server() -> bool:
                with mysql_admin() as conn, conn.cursor() as look:
                    look.execute(
                        "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                        " WHERE DB = %s AND INFO LIKE '%%FOR UPDATE%%' AND ID != %s",
                        (database, blocker.thread_id()),
                    )
                    return bool(look.fetchone()[0])

            wait_for(waits_in_the_server, what="the lock call to wait for the bucket row")
            child.send_signal(signal.SIGINT)
            wait_for(lambda: _signal_taken(child.pid, signal.SIGINT), what="the signal")
            blocker.rollback()  # the server answers the lock call
            out, _ = child.communicate(timeout=30)
        finally:
            child.kill()
    assert out == "interrupted 0\n"


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal."""
    return "\nState:\tT" in Path(f"/proc/{pid}/status").read_text()


def test_a_process_paused_inside_a_transaction_holds_up_other_grants_briefly(
    mysql_url: str,
) -> None:
    """A release that grants is paused (SIGSTOP) between its grant and its commit, holding
    the tokens' counter row, which every grant in the database needs. The server ends the
    idle transaction after `mysql.backend.IDLE_IN_TRANSACTION` seconds, rolling it back, so a grant
    of another name goes through while the process is still paused; resumed, the release
    finds its connection gone, is sent again on a fresh one and grants the waiter then."""
    code = (
        "import os, signal, sys, lockwarden\n"
        "from lockwarden.store.backends.mysql import backend as mysql\n"
        "store = lockwarden.connect(sys.argv[1])\n"
        "held = store.session(app_id='paused').lock('paused')\n"
        "commit = mysql.MySQLBackend._ring_far_and_commit\n"
        "def pause_first(self, *args):\n"
        "    mysql.MySQLBackend._ring_far_and_commit = commit\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"
        "    return commit(self, *args)\n"
        "mysql.MySQLBackend._ring_far_and_commit = pause_first\n"
        "print(held.token, flush=True)\n"
        "sys.stdin.readline()\n"
        "held.release()\n"
        "print(store.stats['retries'], flush=True)\n"
    )
    store = lockwarden.connect(mysql_url)
    child = subprocess.Popen(
        [sys.executable, "-c", code, mysql_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        paused_token = int(child.stdout.readline())
        with store.session(app_id="waiter") as waiter, store.session(app_id="other") as other:
            got = Background(lambda: waiter.lock("paused", timeout=60))
            wait_for(lambda: store.waiters("paused"), what="the waiter to queue")
            child.stdin.write("go\n")
            child.stdin.flush()
            wait_for(lambda: _stopped(child.pid), what="the release to pause")
            try:
                elsewhere = Background(lambda: other.lock("elsewhere", timeout=60))
                # Within the idle timeout and a retry's pause; InnoDB alone would make
                # it wait for the paused process for as long as it stays paused.
                assert elsewhere.result(timeout=IDLE_IN_TRANSACTION + 5).token > paused_token
                assert _stopped(child.pid) and got.is_alive()  # the grant was rolled back
            finally:
                os.kill(child.pid, signal.SIGCONT)
            out, _ = child.communicate(timeout=30)
            assert int(out) >= 1  # the release was sent again
            assert got.result().token > paused_token
            assert [e.holder.session_id for e in store.locks("paused")] == [waiter.id]
    finally:
        child.kill()
        store.close()


def test_a_waiter_whose_doorbell_cannot_hang_yet_times_out_on_time(mysql_url: str) -> None:
    """The waiter's store hangs its doorbell before the first wait, and that statement
    waits for the doorbells' table, locked by another client: the waiter waits for it no
    longer than its own timeout, then times out as asked (it used to wait for as long as
    the table stayed locked)."""
    holder_store, waiter_store = lockwarden.connect(mysql_url), lockwarden.connect(mysql_url)
    try:
        with (
            holder_store.session(app_id="holder") as holder,
            waiter_store.session(app_id="waiter") as waiter,
            pymysql.connect(**mysql_options(mysql_url)) as other,
            other.cursor() as cur,
        ):
            holder.lock("busy")
            cur.execute("LOCK TABLES lw_doorbells WRITE")
            try:
                waiting = Background(lambda: waiter.lock("busy", timeout=1))
                waiting.join(5)
                assert not waiting.is_alive(), "the waiter overran its timeout"
                with pytest.raises(LockTimeout):
                    waiting.result()
            finally:
                cur.execute("UNLOCK TABLES")
    finally:
        holder_store.close()
        waiter_store.close()


def test_tls_asked_for_is_required_and_never_tried_unasked(mysql_url: str) -> None:
    """This server has TLS off. Asked for, TLS must fail the store rather than fall back
    to plain text; not asked for, the connection is plain, as the URL says."""
    with pytest.raises(StoreError, match="SSL is required but the server doesn't support it"):
        lockwarden.connect(mysql_url + "?ssl=true", call_timeout=3)
    with lockwarden.connect(mysql_url) as store, store.session(app_id="plain") as s:
        assert s.lock("tls").token >= 1
    assert _tls({"ssl": True}) == {"ssl": {"check_hostname": False, "verify_mode": False}}
    assert _tls({"ssl_ca": "ca.pem"}) == {"ssl_ca": "ca.pem", "ssl_verify_cert": True}
    assert _tls({"ssl_cert": "c.pem", "ssl_key": "k.pem"}) == {
        "ssl_cert": "c.pem",
        "ssl_key": "k.pem",
        "ssl_verify_cert": False,
    }
    options: dict[str, object] = {"host": "h", "ssl": False}
    assert _tls(options) == {"ssl_disabled": True} and options == {"host": "h"}


def test_connections_find_a_silent_server_in_seconds_not_hours(mysql_url: str) -> None:
    """The doorbell's connection waits in the server for minutes: TCP keepalives (as on
    PostgreSQL) end it about 11 s after the server goes silent, not after two hours."""
    with lockwarden.connect(mysql_url) as store:
        backend: Any = store._backend

        def settings(conn: Any) -> tuple[int, ...]:
            sock = _socket(conn)
            return tuple(
                sock.getsockopt(level, option)
                for level, option in (
                    (socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                    (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
                )
            )

        assert backend._pool.run(settings) == (1, 5, 2, 3, 10_000)
