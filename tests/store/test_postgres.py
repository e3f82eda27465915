"""Only on PostgreSQL: NOTIFY wake-ups, dropped connections, round trips, relaxed durability."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import lockwarden
from lockwarden import LockTimeout, StoreError
from lockwarden.store import Session, Store, inbox
from lockwarden.store.backends.base import AcquireRequest
from lockwarden.store.backends.postgresql import backend as postgres
from lockwarden.store.backends.postgresql import plpgsql
from lockwarden.store.backends.postgresql.connections import Connections, Prepared
from lockwarden.store.backends.sql import queries
from lockwarden.store.opening import parse_url
from tests.conftest import (
    Background,
    enqueue,
    interrupted_after,
    open_connections,
    pg_admin,
    wait_for,
)


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    s = lockwarden.connect(pg_url)
    yield s
    s.close()


def backend_pid(query_like: str, waiting: bool = True) -> int:
    """The server pid of the store connection running a statement like ``query_like``.

    Name the test's schema in the pattern: other test runs may be busy beside this one.
    """
    found: list[int] = []

    def look() -> bool:
        with pg_admin() as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'lockwarden'"
                " AND query LIKE %s AND (NOT %s OR wait_event_type = 'Lock')",
                (query_like, waiting),
            ).fetchall()
        found[:] = [row[0] for row in rows]
        return len(found) == 1

    wait_for(look, what=f"a backend running {query_like}")
    return found[0]


def terminate(pid: int) -> None:
    with pg_admin() as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


def test_acquire_and_release_are_one_round_trip_each(store: Store) -> None:
    with store.session(app_id="rt") as s:
        s.lock("warm").release()  # the first use of a connection prepares nothing we count
        before = store.stats["statements"]
        lock = s.lock("rt")
        assert store.stats["statements"] - before == 1
        before = store.stats["statements"]
        lock.release()
        assert store.stats["statements"] - before == 1


def test_a_calm_name_is_tried_with_plain_statements_and_one_fought_over_goes_to_lw_lock(
    store: Store,
) -> None:
    """A name this store has not seen fought over is tried with the name's advisory lock and
    `queries.TAKE_IDLE` in one round trip; taken, the attempt then calls `lw_lock` (which
    queues the common wait without reading what is in its way) and the name counts as
    fought over: the next attempt calls `lw_lock` at once. Found free, it is calm again."""
    h, w1, w2 = (store.session(app_id=a) for a in ("h", "w1", "w2"))
    lock = h.lock("job")

    def attempt(session: Session) -> tuple[int, str, object]:
        before = store.stats["statements"]
        found = store._backend.acquire(
            AcquireRequest(session.id, secrets.token_hex(16), ("job",), ("X",), True, False, 30.0)
        )
        return store.stats["statements"] - before, found.status, found.rows

    assert attempt(w1) == (2, "blocked", None)  # calm: the try, then lw_lock
    assert "job" in store._backend._contended  # type: ignore[attr-defined]
    assert attempt(w2) == (1, "blocked", None)  # fought over: lw_lock alone
    assert [w.app_id for w in store.waiters("job")] == ["w1", "w2"]
    lock.release()  # granted to w1
    w1.close()
    w2.close()
    free = h.lock("job")  # found free by lw_lock: calm again
    assert "job" not in store._backend._contended  # type: ignore[attr-defined]
    free.release()


def test_the_lock_statement_relaxes_only_a_relaxed_stores_transaction(
    store: Store, pg_schema: str
) -> None:
    """`plpgsql.lock_name`, the first statement of a plain hot-path call, lets the call's
    transaction commit without waiting for the disk when asked to (relaxed durability),
    and leaves the server's setting otherwise."""
    connections = store._backend._connections  # type: ignore[attr-defined]
    lock = Prepared(b"lw_test_lock", plpgsql.lock_name(pg_schema).encode())
    setting = Prepared(b"lw_test_setting", b"SELECT current_setting('synchronous_commit')")
    with pg_admin() as conn:
        found = conn.execute("SHOW synchronous_commit").fetchone()
    assert found is not None
    server = found[0].encode()  # the server's own setting (on, unless configured otherwise)
    for relaxed, expected in ((b"t", b"off"), (b"f", server)):
        found = connections.run(
            lambda conn, r=relaxed: connections.call(conn, (lock, [b"n", r]), (setting, [])),
            lambda: None,
        )
        assert found == (expected,)


def test_a_release_grants_the_waiter_which_wakes_holding_the_lock(store: Store) -> None:
    """No polling, and no second attempt: the release grants, its notification carries the token."""
    with store.session(app_id="h", ttl=30) as h, store.session(app_id="w", ttl=30) as w:
        held = h.lock("push")
        with pytest.raises(LockTimeout):  # the listener is started (once per store)
            w.lock("push", timeout=0.1)
        # In force before counting: coming up, it has every waiter look again (a
        # NOTIFY may have been missed), which on a busy machine can be after 0.1 s.
        wait_for(store._backend._listening.is_set, what="LISTEN to be in force")
        before = store.stats["attempts"]
        waiting = Background(lambda: w.lock("push", timeout=20))
        wait_for(lambda: store.waiters("push"), what="the waiter to queue")
        time.sleep(1.0)  # a polling waiter would try again meanwhile
        assert store.stats["attempts"] - before == 1
        released = time.monotonic()
        held.release()
        lock = waiting.result()
        assert time.monotonic() - released < 0.5
        assert store.stats["attempts"] - before == 1  # granted by the release
        assert [(e.token, e.holder.app_id) for e in store.locks("push")] == [(lock.token, "w")]
        assert lock.token > held.token
        assert store.waiters("push") == []


def _granted_across_stores(
    pg_url: str, pg_schema: str, releaser: Store, name: str
) -> list[tuple[str, str]]:
    """A waiter of another store is granted by ``releaser``'s release, and wakes holding
    the lock: what was notified meanwhile on its store's channel and on the schema's."""
    waiter = lockwarden.connect(pg_url)
    channel = f"lw_{waiter._backend._tag}"
    try:
        with (
            pg_admin() as listener,
            releaser.session(app_id="a") as a,
            waiter.session(app_id="b") as b,
        ):
            listener.execute(f"LISTEN lockwarden_{pg_schema}")
            listener.execute(f"LISTEN {channel}")
            held = a.lock(name)
            waiting = Background(lambda: b.lock(name, timeout=10))
            wait_for(lambda: releaser.waiters(name), what="the waiter to queue")
            held.release()
            lock = waiting.result(timeout=0.5 * inbox.LOOK_EVERY)  # woken, not looking
            assert [(e.token, e.holder.app_id) for e in releaser.locks(name)] == [(lock.token, "b")]
            notes = [(n.channel, n.payload) for n in listener.notifies(timeout=0.5)]
            return [(c, p.replace(f"{lock.id} {lock.token}", "<grant>")) for c, p in notes]
    finally:
        waiter.close()


def test_a_grant_on_this_machine_is_poked_not_notified(
    store: Store, pg_url: str, pg_schema: str
) -> None:
    """A release pokes the inbox of a waiter's store on the releaser's machine: no NOTIFY,
    which would signal every listening connection of the database."""
    assert _granted_across_stores(pg_url, pg_schema, store, "poked") == []


def test_a_grant_to_another_machine_is_notified_to_the_waiters_store_alone(
    store: Store, pg_url: str, pg_schema: str
) -> None:
    """A waiter of another machine is notified on the channel of its store (named by the end
    of its session id), with its request id and token; a path whose waiters must look again
    names the lock."""
    store._backend._near = b"another machine/"
    notes = _granted_across_stores(pg_url, pg_schema, store, "chan")
    assert len(notes) == 1 and notes[0][0].startswith("lw_") and notes[0][1] == "<grant>"
    with pg_admin() as listener, store.session(app_id="a") as a:
        listener.execute(f"LISTEN lockwarden_{pg_schema}")
        a.lock("chan-2")
        store.break_lock("chan-2")
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=1.0, stop_after=1)]
        assert notes == [(f"lockwarden_{pg_schema}", "chan-2")]


def test_a_poke_that_cannot_be_sent_is_notified_instead(
    store: Store, pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter of this machine whose store's inbox cannot be reached (gone, or full) is
    notified on its store's channel, as a waiter of another machine is."""
    monkeypatch.setattr(store._backend._outbox, "poke", lambda session, request, tokens: False)
    notes = _granted_across_stores(pg_url, pg_schema, store, "unpoked")
    assert len(notes) == 1 and notes[0][0].startswith("lw_") and notes[0][1] == "<grant>"


def test_waiters_recover_when_the_listener_connection_dies(store: Store, pg_schema: str) -> None:
    with store.session(app_id="h") as h, store.session(app_id="w") as w:
        held = h.lock("relisten")
        waiting = Background(lambda: w.lock("relisten", timeout=20))
        wait_for(lambda: store.waiters("relisten"), what="the waiter to queue")
        channel = f"lw_{store._backend._tag}"
        terminate(backend_pid(f"LISTEN {channel}", waiting=False))
        wait_for(lambda: store.stats["listener_reconnects"] >= 1, what="the listener to notice")
        time.sleep(0.3)
        held.release()
        waiting.result(timeout=5)


def listeners(channel: str) -> int:
    """How many connections last ran ``LISTEN channel`` (a store's listener does nothing else)."""
    with pg_admin() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s", (f"LISTEN {channel}",)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_store_stops_listening_while_nobody_waits_and_listens_again_for_the_next_waiter(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection that LISTENs is signalled at each notifying commit of the database,
    so an idle store closes its own; a waiter keeps it open however long it waits."""
    monkeypatch.setattr(postgres, "_LISTEN_IDLE", 0.5)
    backend = store._backend
    channel = f"lw_{backend._tag}"
    with store.session(app_id="h", ttl=30) as h, store.session(app_id="w", ttl=30) as w:
        held = h.lock("idle")
        waiting = Background(lambda: w.lock("idle", timeout=20))
        wait_for(lambda: store.waiters("idle"), what="the waiter to queue")
        time.sleep(1.5)  # three idle times: the waiter keeps the listener
        assert listeners(channel) == 1
        held.release()
        waiting.result().release()
        wait_for(lambda: listeners(channel) == 0, what="the LISTEN connection to close")
        assert not backend.listening
        held = h.lock("idle")
        waiting = Background(lambda: w.lock("idle", timeout=20))
        wait_for(lambda: store.waiters("idle") and backend.listening, what="LISTEN again")
        time.sleep(0.3)  # the waiter's look again at once (the listener had stopped) is over
        before = store.stats["attempts"]
        held.release()
        lock = waiting.result(timeout=5)
        assert store.stats["attempts"] == before  # granted by the release, heard by NOTIFY
        assert lock.token > held.token
        assert listeners(channel) == 1
        lock.release()


def test_connections_carry_the_application_name_of_the_url(pg_url: str) -> None:
    """A DBA (or a fault-injection harness) can tell one program's connections apart."""

    def names(store: Store) -> set[str]:
        with store.session(app_id="named"), pg_admin() as conn:
            rows = conn.execute(
                "SELECT application_name FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                " AND application_name IN ('lockwarden', 'billing-7')"
            ).fetchall()
        return {row[0] for row in rows}

    with lockwarden.connect(f"{pg_url}&application_name=billing-7") as named:
        assert "billing-7" in names(named)
    with lockwarden.connect(pg_url) as default:
        assert "lockwarden" in names(default)


@pytest.fixture
def named(pg_url: str) -> Iterator[tuple[Connections, str]]:
    """A store's connections, under an application name of their own."""
    app = f"lw-kept-{secrets.token_hex(3)}"
    connections = Connections(parse_url(f"{pg_url}&application_name={app}"))
    yield connections, app
    connections.close()


def server_pid(
    connections: Connections,
    sql: str = "SELECT pg_backend_pid() AS pid",
    on_retry: Callable[[], object] = lambda: None,
) -> int:
    """Run ``sql`` as a store's statements run; the server pid it returns."""

    def work(conn: Any) -> int:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row["pid"])

    return connections.run(work, on_retry)


SLOW = "SELECT pg_sleep({seconds}), pg_backend_pid() AS pid"
"""A statement that keeps its connection busy for a while."""


def busy_on(pid: int) -> bool:
    with pg_admin() as conn:
        row = conn.execute(
            "SELECT query LIKE %s FROM pg_stat_activity WHERE pid = %s", ("%pg_sleep%", pid)
        ).fetchone()
    return row == (True,)


def test_calls_in_turn_share_the_kept_connection_and_overlapping_calls_do_not_wait(
    named: tuple[Connections, str],
) -> None:
    connections, _ = named
    server_pid(connections)  # the connection that opened the store serves once, then closes
    kept = server_pid(connections)
    assert server_pid(connections) == kept
    busy = Background(lambda: server_pid(connections, SLOW.format(seconds=2)))
    wait_for(lambda: busy_on(kept), what="the slow statement to start on the kept connection")
    other = server_pid(connections)  # a pooled connection, at once
    assert busy.is_alive() and other != kept
    assert busy.result() == kept
    assert server_pid(connections) == kept


def test_a_kept_connection_that_broke_is_replaced(named: tuple[Connections, str]) -> None:
    connections, _ = named
    server_pid(connections)
    kept = server_pid(connections)
    terminate(kept)
    retries: list[None] = []
    replaced = server_pid(connections, on_retry=lambda: retries.append(None))
    assert replaced != kept and len(retries) == 1  # the call failed on it and was retried
    assert server_pid(connections) == replaced


def test_closing_closes_the_kept_connection_even_while_a_call_uses_it(
    named: tuple[Connections, str],
) -> None:
    connections, app = named
    server_pid(connections)
    kept = server_pid(connections)
    busy = Background(lambda: server_pid(connections, SLOW.format(seconds=1)))
    wait_for(lambda: busy_on(kept), what="the slow statement to start on the kept connection")
    connections.close()
    assert busy.result() == kept
    wait_for(lambda: open_connections(app) == 0, what="every connection of the store to close")


def test_connection_killed_mid_acquire_grants_once(store: Store, pg_schema: str) -> None:
    key = plpgsql.lock_key(pg_schema)
    with pg_admin() as blocker, store.session(app_id="a") as s:
        # Hold the name's advisory lock so the acquire stops in the server, at its first step.
        blocker.execute("BEGIN")
        blocker.execute(
            "SELECT pg_advisory_xact_lock(%s, (hashtextextended('mid', 0) & %s)::integer)",
            (key, plpgsql.BUCKETS - 1),
        )
        waiting = Background(lambda: s.lock("mid", timeout=20))
        terminate(backend_pid(f"%pg_advisory_xact_lock({key}, %"))
        wait_for(lambda: store.stats["retries"] >= 1, what="the client to retry")
        blocker.execute("COMMIT")
        lock = waiting.result()
        [entry] = store.locks("mid")
        assert entry.token == lock.token
        assert store.waiters() == []
        lock.release()
        assert store.locks() == []


def test_connection_killed_mid_heartbeat_keeps_the_session(pg_url: str, pg_schema: str) -> None:
    store = lockwarden.connect(pg_url)
    try:
        lost: list[Any] = []
        s = store.session(app_id="a", ttl=3.0, on_lost=lost.append)
        lock = s.lock("hb")
        with pg_admin() as blocker:
            blocker.execute("BEGIN")
            blocker.execute(
                f"SELECT * FROM {pg_schema}.lw_sessions WHERE id = %s FOR UPDATE", (s.id,)
            )
            terminate(backend_pid(f"%UPDATE {pg_schema}.lw_sessions%heartbeat_at%"))
            wait_for(lambda: store.stats["retries"] >= 1, what="the heartbeat to retry")
            blocker.execute("COMMIT")
        time.sleep(1.5)  # more heartbeats go through
        lock.check()
        assert not lost and not s.lost
    finally:
        store.close()


def test_an_unreachable_database_is_one_clear_error() -> None:
    url = "postgresql://postgres:secret@127.0.0.1:1/test?schema=lw_nowhere"
    with pytest.raises(StoreError) as caught:
        lockwarden.connect(url)
    message = str(caught.value)
    assert "postgresql://postgres@127.0.0.1:1/test" in message
    assert "secret" not in message
    assert "refused" in message.lower() or "connect" in message.lower()


def test_without_psycopg_the_error_says_what_to_install(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(StoreError, match=r"pip install 'lockwarden\[postgres\]'"):
        lockwarden.connect(pg_url)


def test_a_multi_lock_of_thousands_of_names(store: Store) -> None:
    names = [f"bulk/{i}" for i in range(3000)]
    with store.session(app_id="bulk") as s:
        stamp = s.lock_many([(n, "write") for n in names], timeout=5)
        assert len(store.locks()) == 3000
        stamp.release()
        assert store.locks() == []


def test_relaxed_durability_keeps_tokens_monotonic_across_a_restart(
    pg_url: str, pg_schema: str
) -> None:
    store = lockwarden.connect(pg_url, durability="relaxed")
    try:
        with store.session(app_id="r") as s:
            before = [s.lock(f"e{i}").token for i in range(3)]
            with pg_admin() as conn:  # what a crash may do: the sequence goes back...
                conn.execute(f"SELECT setval('{pg_schema}.lw_token_seq', 1)")
                # ...and this is how the server tells it restarted
                conn.execute(f"UPDATE {pg_schema}.lw_meta SET value = 0 WHERE key = 'started'")
            after = s.lock("e-after").token
            assert after > max(before)
            assert after >> 40 == 1  # tokens moved on to the next range
            assert s.lock("e-again").token > after  # once
    finally:
        store.close()


def test_a_grant_on_release_after_a_restart_moves_tokens_on(pg_url: str, pg_schema: str) -> None:
    store = lockwarden.connect(pg_url)
    try:
        h, w = store.session(app_id="h"), store.session(app_id="w")
        held = h.lock("handed")
        request = secrets.token_hex(16)
        attempt = store._backend.acquire(
            AcquireRequest(w.id, request, ("handed",), ("X",), True, False, None)
        )
        assert attempt.status == "blocked"
        with pg_admin() as conn:  # a restart, as in the test above
            conn.execute(f"SELECT setval('{pg_schema}.lw_token_seq', 1)")
            conn.execute(f"UPDATE {pg_schema}.lw_meta SET value = 0 WHERE key = 'started'")
        held.release()
        [granted] = store.locks("handed")
        assert granted.holder.app_id == "w"
        assert granted.token > held.token and granted.token >> 40 == 1
    finally:
        store.close()


def test_relaxed_sessions_are_lost_when_the_server_restarted(pg_url: str) -> None:
    store = lockwarden.connect(pg_url, durability="relaxed")
    try:
        lost: list[Any] = []
        s = store.session(app_id="r", ttl=0.6, on_lost=lost.append)
        s.lock("restart")
        s._started = -1.0  # as if the server had started since this session opened
        wait_for(lambda: lost, what="on_lost")
        with store.session(app_id="next") as t:
            t.lock("restart", timeout=1)  # the lost session's lock no longer counts
    finally:
        store.close()


@pytest.mark.parametrize("durability", ["relaxed", "durable"])
def test_only_relaxed_lock_transactions_skip_the_flush(
    pg_url: str, pg_schema: str, durability: str
) -> None:
    """A relaxed store's function turns the flush off for its transaction alone; a durable
    one's leaves the server's own setting."""
    store = lockwarden.connect(pg_url, durability=durability)
    try:
        with store.session(app_id="r") as s, pg_admin() as conn:
            server = conn.execute("SHOW synchronous_commit").fetchone()
            setting = ("off",) if durability == "relaxed" else server
            conn.execute("BEGIN")
            found = conn.execute(
                f"SELECT {pg_schema}.lw_acquire(%s, 'req', ARRAY['x'], ARRAY['X'],"
                " false, false, NULL, %s)",
                (s.id, store._backend.relaxed),
            ).fetchone()
            assert found is not None and found[0]["status"] == "granted"
            assert conn.execute("SHOW synchronous_commit").fetchone() == setting
            conn.execute("ROLLBACK")
            assert conn.execute("SHOW synchronous_commit").fetchone() == server
    finally:
        store.close()


def test_plans_made_on_empty_tables_never_scan_them_once_full(store: Store, pg_schema: str) -> None:
    """The functions' generic plans are made once per connection, with the statistics of that
    moment; one made on empty tables must not scan whole tables once they fill up (found by
    bench/store.py: a sequential scan made acquire 23 times slower with 100,000 locks held)."""
    call = f"SELECT {pg_schema}.lw_acquire(%s, %s, %s, %s, true, false, 1.0, false)"
    with pg_admin() as conn, store.session(app_id="measured") as s:
        conn.execute(call, (s.id, secrets.token_hex(16), ["warm"], ["X"]))  # plans made now
        with store.session(app_id="filler") as filler:
            filler.lock_many([(f"fill/{i}", "write") for i in range(2000)])
            blocked = Background(lambda: s.lock("fill/0", timeout=10))
            wait_for(lambda: store.waiters("fill/0"), what="a waiter in lw_waiters")
            conn.execute("BEGIN")
            conn.execute(call, (s.id, secrets.token_hex(16), ["fresh"], ["X"]))
            scans = dict(
                conn.execute(
                    "SELECT relname, seq_scan FROM pg_stat_xact_user_tables WHERE schemaname = %s",
                    (pg_schema,),
                ).fetchall()
            )
            conn.execute("ROLLBACK")
        blocked.result()
    assert scans.get("lw_holders", 0) == 0
    assert scans.get("lw_waiters", 0) == 0


def test_plain_statements_planned_on_empty_tables_never_scan_them_once_full(
    store: Store, pg_schema: str
) -> None:
    """The same for the plain statements of a calm name's acquire and release, which run
    after `plpgsql.lock_name` (the functions' planner settings) in their transaction: planned
    on the store's connection while the tables were empty (and analyzed so), their plans
    still look the name up once thousands of locks are held. (Without the settings they
    scanned lw_sessions, lw_holders and lw_waiters whole.)"""
    backend = store._backend
    with pg_admin() as admin:  # statistics that say so, as autovacuum may leave them
        for table in ("lw_holders", "lw_waiters", "lw_sessions"):
            admin.execute(f"ANALYZE {pg_schema}.{table}")
    lock = backend._lock_name.name.decode()  # type: ignore[attr-defined]

    def plan(statement: Prepared, args: str) -> str:
        """The plan that the store's connection (one thread: the kept one, every time) uses
        for ``statement`` in a transaction of the hot path."""
        name = statement.name.decode()

        def explain(conn: Any) -> list[Any]:
            with conn.transaction():
                conn.execute(f"EXECUTE {lock}('n', false)")
                return conn.execute(f"EXPLAIN EXECUTE {name}({args})").fetchall()

        return "\n".join(row["QUERY PLAN"] for row in backend._run(explain))  # type: ignore[attr-defined]

    with store.session(app_id="measured") as s:
        for i in range(8):  # planned now, on empty tables, and past the custom plans
            s.lock(f"warm/{i}").release()
        with store.session(app_id="filler") as filler:
            filler.lock_many([(f"fill/{i}", "write") for i in range(2000)])
            for statement, args in (
                (backend._take_idle_one, "'s', 'r', 'n', 'X'"),  # type: ignore[attr-defined]
                (backend._release_idle_one, "'s', 'r', 'n'"),  # type: ignore[attr-defined]
            ):
                found = plan(statement, args)
                assert "Seq Scan" not in found and "Bitmap" not in found, found


def _function_state(pg_schema: str) -> tuple[list[str], int]:
    """The schema's ``lw_...`` function signatures, and the recorded fingerprint."""
    with pg_admin() as conn:
        signatures = [
            row[0]
            for row in conn.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc AS p"
                " WHERE p.pronamespace = %s::regnamespace AND p.proname LIKE 'lw\\_%%'"
                " ORDER BY 1",
                (pg_schema,),
            )
        ]
        found = conn.execute(
            f"SELECT value FROM {pg_schema}.lw_meta WHERE key = 'functions'"
        ).fetchone()
    assert found is not None
    return signatures, found[0]


def test_functions_follow_the_library_whatever_the_schema_version(
    store: Store, pg_url: str, pg_schema: str
) -> None:
    """A store left on other function bodies (an older lockwarden's, with an old overload and
    its own fingerprint) gets this library's functions back on the next connect."""
    current = _function_state(pg_schema)
    assert current[1] == plpgsql.fingerprint(pg_schema)
    with pg_admin() as conn:  # what an older library would have left behind
        conn.execute(
            f"CREATE OR REPLACE FUNCTION {pg_schema}.lw_release(_session text, _request text,"
            " _names text[], _relaxed boolean, _near text, OUT _n bigint, OUT _pokes text)"
            " LANGUAGE sql AS 'SELECT cardinality($3)::bigint, NULL::text'"
        )
        conn.execute(
            f"CREATE FUNCTION {pg_schema}.lw_acquire(_session text, _request text)"
            " RETURNS jsonb LANGUAGE sql AS 'SELECT NULL::jsonb'"
        )
        conn.execute(f"UPDATE {pg_schema}.lw_meta SET value = 42 WHERE key = 'functions'")
    both = [("body", "write"), ("other", "write")]  # a multi-lock: always the functions
    with store.session(app_id="old") as s:
        s.lock_many(both).release()  # still on the old body, which deletes nothing...
        assert len(store.locks("body")) == 1  # ...which is what an upgrade must not leave
    assert len(_function_state(pg_schema)[0]) == len(current[0]) + 1

    with lockwarden.connect(pg_url) as upgraded, upgraded.session(app_id="new") as s:
        assert _function_state(pg_schema) == current  # restored, and the overload gone
        upgraded.break_lock("body")
        upgraded.break_lock("other")
        s.lock_many(both).release()
        assert upgraded.locks() == []


def test_concurrent_connects_to_a_store_with_stale_functions_all_succeed(
    store: Store, pg_url: str, pg_schema: str
) -> None:
    """Connecting processes re-create the functions one at a time (the migration lock), and
    calls running beside the re-creation keep working."""
    current = _function_state(pg_schema)
    with pg_admin() as conn:
        conn.execute(f"UPDATE {pg_schema}.lw_meta SET value = 42 WHERE key = 'functions'")
    stop = time.monotonic() + 3.0

    def busy() -> int:
        done = 0
        with store.session(app_id="busy") as s:
            while time.monotonic() < stop:
                s.lock("busy").release()
                done += 1
        return done

    def reconnect() -> int:
        connected = 0
        while time.monotonic() < stop:
            with pg_admin() as conn:
                conn.execute(f"UPDATE {pg_schema}.lw_meta SET value = 42 WHERE key = 'functions'")
            lockwarden.connect(pg_url).close()
            connected += 1
        return connected

    worker = Background(busy)
    connectors = [Background(reconnect) for _ in range(4)]
    assert all(c.result() > 0 for c in connectors)
    assert worker.result() > 0
    lockwarden.connect(pg_url).close()
    assert _function_state(pg_schema) == current


def test_stray_notifications_on_the_grant_channel_harm_nobody(store: Store, pg_schema: str) -> None:
    """Anyone who can connect may NOTIFY on any channel; the listener must go on."""
    with store.session(app_id="h") as h, store.session(app_id="w") as w, pg_admin() as admin:
        held = h.lock("stray")
        waiting = Background(lambda: w.lock("stray", timeout=20))
        wait_for(lambda: store.waiters("stray"), what="the waiter to queue")
        for payload in ("", "x", "nobody 12", "nobody ²", "nobody -1", " 5"):
            admin.execute("SELECT pg_notify(%s, %s)", (f"lw_{w.id[-16:]}", payload))
        time.sleep(0.3)
        assert store.waiters("stray")  # nobody was fooled into holding it
        held.release()
        assert waiting.result(timeout=5).token > held.token


def test_the_lock_calls_are_prepared_again_where_the_server_forgot_them(store: Store) -> None:
    """The hot path's prepared statements (`connections.Connections.call`) are made again on a
    connection whose prepared statements are gone (a pooler's reset, DEALLOCATE)."""
    with store.session(app_id="prep") as s:
        first = s.lock("prep")
        first.release()
        store._backend._connections.run(  # type: ignore[attr-defined]
            lambda conn: conn.execute("DEALLOCATE ALL"), lambda: None
        )
        second = s.lock("prep")
        assert second.token > first.token
        second.release()
        assert store.locks() == []


def test_names_in_any_script_and_waits_without_limit_travel_intact(store: Store) -> None:
    name = "ключ/日本語 ✓ 'quoted' \"double\" {brace}, comma\\slash"
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        held = a.lock(name)
        waiting = Background(lambda: b.lock(name, timeout=None))
        wait_for(lambda: len(store.waiters(name)) == 1, what="the waiter to queue")
        [entry] = store.waiters(name)
        assert (entry.name, entry.expires_in) == (name, None)
        held.release()
        granted = waiting.result()
        assert granted.token > held.token
        [holder] = store.locks(name)
        assert (holder.name, holder.token) == (name, granted.token)
        granted.release()


def test_ctrl_c_interrupts_a_lock_call_the_server_has_not_answered(
    pg_url: str, pg_schema: str
) -> None:
    """The prepared calls wait for the server in a poll that lets a signal's handler run:
    Ctrl-C ends a lock call stuck in the server (here behind another transaction on the
    name's advisory lock) at once, not when the server answers. (The backend's call
    alone: `Session.lock` would then give the request back, which waits for the name.)"""
    key = plpgsql.lock_key(pg_schema)
    code = (
        "import os, sys, lockwarden\n"
        "from lockwarden.store.backends.base import AcquireRequest\n"
        "store = lockwarden.connect(sys.argv[1])\n"
        "s = store.session(app_id='sigint')\n"
        "s.lock('warm').release()\n"
        "print('ready', flush=True)\n"
        "try:\n"
        "    store._backend.acquire(\n"
        "        AcquireRequest(s.id, 'r' * 32, ('stuck',), ('X',), True, False, 60.0))\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    os._exit(0)\n"
    )
    with pg_admin() as blocker:
        blocker.execute("BEGIN")
        blocker.execute(
            "SELECT pg_advisory_xact_lock(%s, (hashtextextended('stuck', 0) & %s)::integer)",
            (key, plpgsql.BUCKETS - 1),
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code, pg_url], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            backend_pid(f"%pg_advisory_xact_lock({key}, %")  # the call waits in the server
            child.send_signal(signal.SIGINT)
            out, _ = child.communicate(timeout=10)  # the blocker still holds the name
        finally:
            child.kill()
            blocker.execute("ROLLBACK")
    assert out == "interrupted\n"


def _holder_rows(schema: str, name: str) -> list[tuple[str, ...]]:
    """Every holder row of ``name``, whether or not its session is still there (`locks`
    shows only those joined to a session)."""
    with pg_admin() as conn:
        rows = conn.execute(
            f"SELECT session_id, request_id FROM {schema}.lw_holders WHERE name = %s", (name,)
        )
        return [tuple(row) for row in rows]


def test_a_session_closing_while_a_release_grants_to_it_keeps_nothing(
    store: Store, pg_schema: str
) -> None:
    """A release grants a waiter, and before the grant commits the waiter's session
    closes: the close waits for the grant and deletes the lock it made. (It used to
    delete the session's holder rows as they were before the grant, and the grant's
    row outlived the session: the name lost its one-statement acquire until `clean`.)"""
    with store.session(app_id="h") as h, store.session(app_id="w") as w:
        held = h.lock("race")
        enqueue(w, {"race": "X"}, 60.0)
        with pg_admin() as release:
            release.execute("BEGIN")
            release.execute(
                f"SELECT {pg_schema}.lw_release(%s, %s, ARRAY['race'], false, NULL)",
                (h.id, held.id),
            )
            assert [s for s, _ in _holder_rows(pg_schema, "race")] == [h.id]  # not committed
            closing = Background(w.close)
            backend_pid(f"%{pg_schema}.lw_waiters WHERE session_id%")  # waits for the grant
            release.execute("COMMIT")
            closing.result()
        assert _holder_rows(pg_schema, "race") == []
        with store.session(app_id="later") as later:
            before = store.stats["statements"]
            later.lock("race", timeout=0).release()  # the one-statement acquire, and release
            assert store.stats["statements"] - before == 2


@pytest.mark.parametrize("mode", ["X", "S"])
def test_a_release_grants_nothing_to_a_session_closing_meanwhile(
    store: Store, pg_schema: str, mode: str
) -> None:
    """A session closes, and before the close commits a release would grant to it: the
    grant waits for the close and, the waiter gone, passes the lock to the next in line.
    A writer at the head is granted by one statement (`plpgsql._GRANT_HEAD`), a reader by
    `lw_grant`'s loop: both dequeue before they grant."""
    d = queries.postgres(pg_schema)
    with store.session(app_id="h") as h, store.session(app_id="w") as w:
        held = h.lock("race")
        enqueue(w, {"race": mode}, 60.0)
        with store.session(app_id="next") as nxt:
            after = enqueue(nxt, {"race": "X"}, 60.0)
            with pg_admin() as close:
                close.execute("BEGIN")
                first, *rest = queries.CLOSE_SESSION
                close.execute(d.render(first), {"session": w.id})
                releasing = Background(held.release)
                backend_pid(f"%{pg_schema}.lw_release%")  # its grant waits for the close
                for statement in rest:
                    close.execute(d.render(statement), {"session": w.id})
                close.execute("COMMIT")
                releasing.result()
            assert _holder_rows(pg_schema, "race") == [(nxt.id, after)]


@pytest.mark.parametrize("sent", [False, True])
def test_a_call_cut_short_while_sending_leaves_no_connection_in_pipeline_mode(
    store: Store, sent: bool
) -> None:
    """A call interrupted while it was still sending, before anything went or before its
    Sync (so the server never answers; given up once `connections.SETTLE` has passed), leaves
    its connection out of libpq's pipeline mode, or closed: the store's next calls run.
    (Left in pipeline mode, the connection went back to the pool looking idle, and the
    next statement on it waited for an answer that never comes.)"""
    connections = store._backend._connections  # type: ignore[attr-defined]

    def cut_short(conn: Any) -> None:
        def send() -> int:
            if sent:
                conn.pgconn.send_query_params(b"SELECT 1", None)
            raise KeyboardInterrupt

        connections._exchange(conn, send)

    with pytest.raises(KeyboardInterrupt):
        connections.run(cut_short, lambda: None)
    found = Background(  # on the same (kept) connection, if it was kept
        lambda: connections.run(
            lambda conn: conn.execute("SELECT 1 AS one").fetchone(), lambda: None
        )
    )
    assert found.result(timeout=5) == {"one": 1}


def test_a_statement_whose_wait_is_interrupted_has_ended_when_the_caller_hears(
    store: Store, pg_schema: str
) -> None:
    """Ctrl-C while a prepared call waits for the server: by the time the exception
    reaches the caller, its statements were cancelled and rolled back, those before the
    one waited for included (one transaction). (The server used to go on with a statement
    and commit it later: a lock call giving its request back at once could do so before
    its own grant committed, and the grant then stayed held.)"""
    connections = store._backend._connections  # type: ignore[attr-defined]
    with pg_admin() as admin:
        admin.execute(f"CREATE TABLE {pg_schema}.marks (n integer)")
    first = Prepared(b"lw_test_mark", f"INSERT INTO {pg_schema}.marks VALUES (2)".encode())
    sql = f"WITH nap AS (SELECT pg_sleep(1.0)) INSERT INTO {pg_schema}.marks SELECT 1 FROM nap"
    slow = Prepared(b"lw_test_slow", sql.encode())
    with interrupted_after(0.2):  # while the call waits
        connections.run(lambda conn: connections.call(conn, (first, []), (slow, [])), lambda: None)
    with pg_admin() as admin:
        running = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1.0)%'"
            " AND state = 'active' AND pid != pg_backend_pid()"
        ).fetchone()
        assert running == (0,)
        time.sleep(1.2)  # past the end of the statement, had it gone on
        assert admin.execute(f"SELECT count(*) FROM {pg_schema}.marks").fetchone() == (0,)
