"""Only on SQLite: wake-ups from other processes, and fairness between this store's writers."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from lockwarden import LockLost, LockUsageError, StoreError
from lockwarden.modes import Mode
from lockwarden.store import Store, connect
from lockwarden.store.backends.sql import queries
from lockwarden.store.backends.sqlite import backend as sqlite
from lockwarden.store.opening import parse_url
from tests.conftest import Background, Child, interrupted_after, wait_for


@pytest.fixture
def url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.mark.slow
def test_a_release_in_another_process_wakes_a_waiter_here(
    store: Store, url: str, children: Callable[..., Child]
) -> None:
    holder = children("holder", url, "xproc", "5")
    holder.expect()
    with store.session(app_id="here") as s:
        waiting = Background(lambda: s.lock("xproc", timeout=10))
        wait_for(lambda: store.waiters("xproc"), what="the waiter to queue")
        time.sleep(0.5)  # long enough for the poll to back off to its slowest
        sent = time.monotonic()
        assert holder.send("release") == {"released": True}
        waiting.result()
        assert time.monotonic() - sent < 0.25  # the poller saw the commit within ~50 ms


@pytest.mark.skipif(sys.platform != "linux", reason="pokes use Linux's abstract sockets")
def test_a_release_in_another_process_pokes_the_granted_waiter(
    store: Store, url: str, children: Callable[..., Child], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release hands the grant to the waiter's own store through its inbox: the waiter
    holds the lock without polling (the poller here is slowed to 30 s) or another attempt."""
    monkeypatch.setattr(sqlite, "POLL_MIN", 30.0)
    monkeypatch.setattr(sqlite, "POLL_MAX", 30.0)
    holder = children("holder", url, "poked", "5")
    holder.expect()
    with store.session(app_id="here") as s:
        waiting = Background(lambda: s.lock("poked", timeout=20))
        wait_for(lambda: store.waiters("poked"), what="the waiter to queue")
        time.sleep(0.3)  # its attempts are made: it waits
        attempts = store.stats["attempts"]
        assert holder.send("release") == {"released": True}
        lock = waiting.result(timeout=10)
        assert [e.token for e in store.locks("poked")] == [lock.token]
        assert store.stats["handed"] == 1 and store.stats["attempts"] == attempts


@pytest.mark.skipif(sys.platform != "linux", reason="pokes use Linux's abstract sockets")
@pytest.mark.parametrize("freed_by", ["close", "break"])
def test_a_waiter_sleeps_through_other_commits_and_wakes_for_its_name(
    store: Store, url: str, monkeypatch: pytest.MonkeyPatch, freed_by: str
) -> None:
    """Where pokes arrive, the poller's wake-up of every waiter is only a safety net (here
    slowed to 30 s): locks of other names coming and going cost the waiter no attempt, and
    a change that frees its name (a closed session, a broken lock) pokes it."""
    monkeypatch.setattr(sqlite, "SAFETY_NET", 30.0)
    with connect(url) as theirs, connect(url) as busy, store.session(app_id="here") as s:
        holder = theirs.session(app_id="holder")
        holder.lock("a")
        waiting = Background(lambda: s.lock("a", timeout=20))
        wait_for(lambda: store.waiters("a"), what="the waiter to queue")
        time.sleep(0.3)  # its attempts are made: it waits
        attempts = store.stats["attempts"]
        with busy.session(app_id="busy") as b:
            for _ in range(30):
                b.lock("b").release()
        time.sleep(0.3)  # the poller here has seen those commits
        assert store.stats["attempts"] == attempts
        if freed_by == "close":
            holder.close()
        else:
            busy.break_lock("a")
        lock = waiting.result(timeout=10)
        assert [e.token for e in store.locks("a")] == [lock.token]
        holder.close()


def test_a_fought_over_name_goes_straight_to_the_full_attempt(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-statement try (`TAKE_IDLE`) is skipped for a name whose release let someone
    in or whose attempt was blocked, until the name is found free again."""
    backend = store._backend
    tries: list[str] = []
    real = backend._write_one  # type: ignore[attr-defined]

    def counted(sql: str, params: dict[str, object]) -> object:
        if sql == sqlite._TAKE_IDLE:
            tries.append(str(params["name"]))
        return real(sql, params)

    monkeypatch.setattr(backend, "_write_one", counted)
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        first = a.lock("x")
        waiting = Background(lambda: b.lock("x", timeout=10))
        wait_for(lambda: store.waiters("x"), what="b to queue")
        assert tries == ["x", "x"]  # b tried, and found it taken
        first.release()  # lets b in
        second = waiting.result()
        again = Background(lambda: a.lock("x", timeout=10))
        wait_for(lambda: store.waiters("x"), what="a to queue")
        assert tries == ["x", "x"]  # no try this time
        second.release()
        again.result().release()  # nobody waits now
        a.lock("x").release()
        assert tries == ["x", "x", "x"]  # free again: tried first again


def _trace(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Every statement the stores opened from now on run: (connection, statement)."""
    seen: list[tuple[int, str]] = []
    real = sqlite.sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs)
        name = id(conn)
        conn.set_trace_callback(lambda sql: seen.append((name, sql)))
        return conn

    monkeypatch.setattr(sqlite.sqlite3, "connect", traced)
    return seen


MADE_DURABLE = "UPDATE lw_meta SET value = value + 1 WHERE key = 'seq'"
"""`SQLiteBackend._make_durable`'s write, as SQLite's trace shows it."""


def test_a_fought_over_attempt_waits_for_the_disk_only_if_it_grants(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt on a name fought over commits without waiting for the disk: it almost
    always only queues, and a forgotten queue entry is harmless. If it grants after all,
    a durable write carries the grant to disk before the caller is told."""
    seen = _trace(monkeypatch)
    with connect(url) as store, store.session(app_id="a") as a, store.session(app_id="b") as b:
        backend = store._backend
        held = b.lock("x")
        backend._contended.note(["x"], fought=True)  # type: ignore[attr-defined]
        start = len(seen)
        waiting = Background(lambda: a.lock("x", timeout=10))
        wait_for(lambda: store.waiters("x"), what="a to queue")
        assert any("INSERT INTO lw_waiters" in sql for sql in _ran(seen, start, relaxed=True))
        assert MADE_DURABLE not in (sql for _, sql in seen)
        held.release()
        waiting.result().release()

        backend._contended.note(["x"], fought=True)  # type: ignore[attr-defined]
        start = len(seen)
        a.lock("x").release()  # free after all: granted by the relaxed attempt
        granted = [i for i, (_, sql) in enumerate(seen) if "INSERT INTO lw_holders" in sql]
        assert granted and _ran(seen, granted[-1], relaxed=True)[:1] == [seen[granted[-1]][1]]
        made = [i for i, (_, sql) in enumerate(seen) if sql == MADE_DURABLE]
        assert made and made[-1] > granted[-1]  # after the relaxed commit, on a durable one
        assert MADE_DURABLE in _ran(seen, start, relaxed=False)


def _ran(seen: list[tuple[int, str]], start: int, *, relaxed: bool) -> list[str]:
    """The statements run from ``start`` on connections whose commits do (``relaxed=False``)
    or do not wait for the disk."""
    normal = {conn for conn, sql in seen if sql == "PRAGMA synchronous = NORMAL"}
    return [sql for conn, sql in seen[start:] if (conn in normal) == relaxed]


def test_a_busy_writer_does_not_starve_a_heartbeat(store: Store) -> None:
    """Back-to-back write transactions in one thread; the heartbeat still gets its turn."""
    quiet = store.session(app_id="quiet", ttl=0.6)
    held = quiet.lock("kept")
    busy = store.session(app_id="busy", ttl=30)
    stop = time.monotonic() + 1.5
    done = threading.Event()

    def hammer() -> None:
        while time.monotonic() < stop:
            busy.lock_many([(f"busy/{i}", "write") for i in range(300)]).release()
        done.set()

    Background(hammer).result(timeout=30)
    assert done.is_set()
    held.check()  # still live: its beats went through between the busy writer's transactions
    assert not quiet.lost


@pytest.mark.parametrize("statement", ["ACQUIRE_STATE", "GRANTED", "CHECK", "RELEASE"])
def test_a_request_is_found_through_its_session_and_request(store: Store, statement: str) -> None:
    """By both ids, not by the session alone: that walked every lock the session holds, so
    acquire and release slowed with each lock a session took (found by bench/store.py)."""
    params = {"session": "s", "request": "r", "names": ["a"], "modes": ["X"]}
    plan = store._backend.query("EXPLAIN QUERY PLAN " + getattr(queries, statement), params)
    details = " / ".join(row["detail"] for row in plan)
    assert "lw_holders_owner (session_id=? AND request_id=?" in details
    assert "SCAN lw_holders" not in details


def test_the_holders_table_has_no_rowid_and_one_index_beside_its_key(store: Store) -> None:
    """Each b-tree of lw_holders is written by every grant and every release (version 8)."""
    shapes = store._backend.query(
        "SELECT type, name, sql FROM sqlite_master WHERE tbl_name = 'lw_holders'"
    )
    assert {(r["type"], r["name"]) for r in shapes} == {
        ("table", "lw_holders"),
        ("index", "lw_holders_owner"),
        ("trigger", "lw_holders_token"),
    }
    [table] = [r["sql"] for r in shapes if r["type"] == "table"]
    assert table.rstrip().endswith("WITHOUT ROWID")


def test_twenty_thousand_names_lock_and_release(store: Store) -> None:
    """A multi-lock's (name, mode) pairs are read in one pass: a join of two json_each
    tables has no index, and made `lock_many` quadratic (22 s for 20,000 names)."""
    items = [(f"many/{i}", Mode.S if i % 3 == 0 else Mode.X) for i in range(20_000)]
    with store.session(app_id="many") as s:
        stamp = s.lock_many(items, timeout=0)
        held = {row.name: row.mode for row in store.locks()}
        assert held == dict(items)
        stamp.release()
    assert not store.locks()


def test_queued_processes_are_granted_in_queue_order(
    store: Store, url: str, children: Callable[..., Child]
) -> None:
    with store.session(app_id="first") as s:
        held = s.lock("line")
        waiters = []
        for n in range(1, 5):
            waiters.append(children("waiter", url, "line", "30"))
            wait_for(lambda n=n: len(store.waiters("line")) == n, what=f"waiter {n} to queue")
        held.release()
    tokens = [child.expect()["token"] for child in waiters]
    assert tokens == sorted(tokens)  # each granted, and in the order they queued


def test_a_free_name_is_taken_by_one_statement_and_tokens_keep_growing(store: Store) -> None:
    """The token counter is moved by a trigger on lw_holders, inside the granting INSERT."""
    with store.session(app_id="one") as s:
        before = store.stats["statements"]
        first = s.lock("solo")
        assert store.stats["statements"] - before == 1
        first.release()
        many = s.lock_many([("solo", "write"), ("duo", "read"), ("trio", "write")])
        assert min(many.tokens.values()) > first.token
        assert len(set(many.tokens.values())) == 3
        many.release()
        assert s.lock("solo").token > max(many.tokens.values())  # never reused once released


def test_a_release_nobody_waits_for_is_one_statement_and_one_with_waiters_grants(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_RELEASE_IDLE` deletes only where nobody waits, as a transaction of its own;
    otherwise the full release decides, granting the waiter (the hand-off's shortcut), or
    saying the lock was lost."""
    seen = _trace(monkeypatch)
    with connect(url) as store, store.session(app_id="a") as a, store.session(app_id="b") as b:
        held = a.lock("r")
        start = len(seen)
        held.release()
        [ran] = [sql for _, sql in seen[start:]]  # no BEGIN, no COMMIT: one statement
        assert ran.lstrip().startswith("DELETE FROM lw_holders") and "lw_waiters" in ran
        held = a.lock("r")
        waiting = Background(lambda: b.lock("r", timeout=10))
        wait_for(lambda: store.waiters("r"), what="b to queue")
        store._backend._contended.note(["r"], fought=False)  # type: ignore[attr-defined]
        start = len(seen)
        held.release()
        granted = waiting.result()
        ran = " / ".join(sql for _, sql in seen[start:])
        assert "WITH head AS" in ran  # the hand-off's shortcut (`queries.HEAD_ALONE`)...
        assert "GROUP BY w.request_id" not in ran  # ...not the grant loop's candidates
        assert [e.token for e in store.locks("r")] == [granted.token] and granted.token > held.token
        store.break_lock("r")
        with pytest.raises(LockLost):
            granted.release()
        assert store.locks("r") == [] and store.waiters("r") == []


def test_relaxed_lock_transactions_do_not_wait_for_the_disk_and_the_rest_does(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``durability="relaxed"``: grants and releases commit with ``synchronous = NORMAL``;
    sessions, heartbeats and fences stay durable, as on PostgreSQL."""
    seen = _trace(monkeypatch)
    with connect(url, durability="relaxed") as store:
        start = len(seen)
        with store.session(app_id="r") as s:
            s.lock("x").release()
            many = s.lock_many([("x", "write"), ("y", "read")])
            store.fence("f").write(many.tokens["x"], "v")
            many.release()
        relaxed = " / ".join(_ran(seen, start, relaxed=True))
        durable = " / ".join(_ran(seen, start, relaxed=False))
    assert "INSERT INTO lw_holders" in relaxed and "DELETE FROM lw_holders" in relaxed
    assert "INSERT INTO lw_holders" not in durable  # (a fence reads them, durably)
    assert "INSERT INTO lw_sessions" in durable and "lw_fences" in durable
    assert "INSERT INTO lw_sessions" not in relaxed and "lw_fences" not in relaxed


def test_tokens_move_on_when_the_store_is_first_opened_after_the_machine_restarted(
    url: str,
) -> None:
    """A relaxed grant that a power loss forgot may have handed out tokens the counter no
    longer remembers: the first opening after a restart moves them on to the next 2^40
    range, durably, so no token is ever handed out twice."""
    with connect(url) as store, store.session(app_id="before") as s:
        for _ in range(5):
            held = s.lock("t")
            held.release()
        first = held.token
        assert first < 2**40  # a new store starts low
        # The machine restarts: the last grants were forgotten (the counter is back
        # where it was 3 grants ago), and the boot recorded is another one's.
        for forget in (
            "UPDATE lw_meta SET value = value - 3 WHERE key = 'token'",
            "UPDATE lw_meta SET value = value + 1 WHERE key = 'boot'",
        ):
            store._backend.query(forget, write=True)
    with connect(url) as after, after.session(app_id="after") as s:
        token = s.lock("t").token
        assert token > first and token >> 40 == (first >> 40) + 1
    with connect(url) as again, again.session(app_id="again") as s:
        assert s.lock("t").token == token + 1  # the same boot: no second move


def test_relaxed_is_refused_where_a_restart_of_the_machine_cannot_be_seen(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite.process, "boot", lambda: None)
    with pytest.raises(LockUsageError, match="relaxed durability needs to know when"):
        connect(url, durability="relaxed")
    connect(url).close()  # durable: the counter is on disk before a token is handed out


def test_stores_opened_at_once_on_a_new_file_all_open(tmp_path: Any) -> None:
    """Turning a new file to WAL needs it alone, and SQLite does not wait for that
    (no busy handler): processes opening a new store together saw 'database is
    locked'. Each opening must wait its turn instead."""
    for round_ in range(40):
        assert _open_at_once(f"sqlite:///{tmp_path}/{round_}.db", 8) == []


def _open_at_once(target: str, count: int) -> list[BaseException]:
    """Open ``count`` stores on ``target`` from as many threads at once; what they raised."""
    start = threading.Barrier(count)
    failures: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            connect(target).close()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


def test_a_writer_interrupted_while_waiting_its_turn_leaves_the_queue() -> None:
    """Ctrl-C while the main thread waits its turn to write behind another thread of the
    process: it leaves the queue, and the holder's exit lets the next writer in. (The
    turn used to stay queued: the lock passed to a thread no longer waiting, and every
    writer of the process waited for ever.)"""
    fair = sqlite._FairLock()
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with fair:
            inside.set()
            leave.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    inside.wait()
    with interrupted_after(0.2):  # while the main thread waits its turn
        fair.__enter__()
    leave.set()
    holder.join()
    assert_another_thread_gets_in(fair)


def assert_another_thread_gets_in(turn: Any) -> None:
    """Another thread of the process enters ``turn`` (a writer's lock) within 5 s."""
    entered = threading.Event()

    def enter() -> None:
        with turn:
            entered.set()

    thread = threading.Thread(target=enter, daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert entered.is_set()


def test_a_writer_interrupted_as_it_lets_go_of_the_file_still_lets_the_process_in(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C as the unlock of the writer's file returns (here raised just after it):
    the turn inside the process is given up all the same, so the next writer of the
    process gets in rather than waiting for ever."""
    writer = sqlite._Writer(parse_url(str(tmp_path / "store.db")))
    unlock = sqlite.fcntl.flock

    def interrupted(fd: int, operation: int) -> None:
        unlock(fd, operation)
        if operation == sqlite.fcntl.LOCK_UN:
            raise KeyboardInterrupt

    try:
        writer.__enter__()
        monkeypatch.setattr(sqlite.fcntl, "flock", interrupted)
        with pytest.raises(KeyboardInterrupt):
            writer.__exit__(None, None, None)
        monkeypatch.undo()
        assert_another_thread_gets_in(writer)
    finally:
        writer.close()


def test_a_writer_that_waited_for_the_file_holds_it_until_it_lets_go(tmp_path: Any) -> None:
    """The wait for the writers' file lock runs in a thread of the store's (`_FileWait`);
    the lock it takes is the writer's until the writer lets go, never the thread's to drop."""
    writer = sqlite._Writer(parse_url(str(tmp_path / "store.db")))
    other = os.open(str(tmp_path / "store.db-writer"), os.O_RDWR)  # as another process's
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        got = threading.Event()
        threading.Thread(target=lambda: (writer.__enter__(), got.set()), daemon=True).start()
        assert not got.wait(0.2)
        fcntl.flock(other, fcntl.LOCK_UN)
        assert got.wait(5)
        time.sleep(0.2)
        with pytest.raises(BlockingIOError):  # still the writer's
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        writer.__exit__(None, None, None)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once it let go
        fcntl.flock(other, fcntl.LOCK_UN)
    finally:
        os.close(other)
        writer.close()


def test_a_writer_waits_for_the_file_no_longer_than_its_call_timeout(tmp_path: Any) -> None:
    url = parse_url(str(tmp_path / "store.db"))._replace(call_timeout=0.3)
    writer = sqlite._Writer(url)
    other = os.open(str(tmp_path / "store.db-writer"), os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(StoreError, match=f"process {os.getpid()} holds the store's write"):
            writer.__enter__()
        assert 0.25 < time.monotonic() - started < 2.0
        fcntl.flock(other, fcntl.LOCK_UN)
        writer.__enter__()  # its turn was given up: the next writer gets in
        writer.__exit__(None, None, None)
    finally:
        os.close(other)
        writer.close()
