"""Behaviour of sessions and their locks, on both backends (same tests, one fixture)."""

from __future__ import annotations

import pickle
import random
import threading
import time
from collections.abc import Callable

import pytest

import lockwarden
from lockwarden import (
    Deadlock,
    HeldTooLong,
    HolderUnresponsive,
    LockLost,
    LockTimeout,
    LockUsageError,
    Mode,
    NotHeld,
)
from lockwarden.store import Cleaned, HeldLock, Stamp, Store
from lockwarden.store.backends.base import AcquireRequest
from tests.conftest import Background, lease_slack, resume_heartbeat, stop_heartbeat, wait_for


def test_lock_release_and_tokens_grow(store: Store) -> None:
    with store.session(app_id="t") as s:
        tokens = []
        for _ in range(3):
            with s.lock("reports/nightly", mode="write", timeout=5.0) as lk:
                assert isinstance(lk, HeldLock)
                assert (lk.name, lk.mode) == ("reports/nightly", Mode.X)
                lk.check()
                [entry] = store.locks()
                assert (entry.name, entry.mode, entry.token) == (lk.name, Mode.X, lk.token)
                assert entry.holder.session_id == s.id and entry.holder.app_id == "t"
                assert not entry.stale
                tokens.append(lk.token)
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
        assert store.locks() == []


def test_writers_exclude_readers_share(store: Store) -> None:
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        r1 = a.lock("doc", "read", timeout=1)
        r2 = b.lock("doc", "read", timeout=1)
        with store.session(app_id="c") as c:
            assert c.try_lock("doc", "write") is None
        r1.release()
        r2.release()
        w = a.lock("doc", "write", timeout=1)
        assert b.try_lock("doc", "read") is None
        assert b.try_lock("doc", "write") is None
        w.release()
        assert b.try_lock("doc", "read") is not None


def test_try_lock_failure_reports_blockers(store: Store) -> None:
    with store.session(app_id="holder") as a, store.session(app_id="other") as b:
        held = a.lock("x")
        with pytest.raises(LockTimeout) as caught:
            b.lock("x", timeout=0)
        assert caught.value.resource == "x"
        [blocker] = caught.value.blockers
        assert isinstance(blocker, lockwarden.Holder)
        assert (blocker.session_id, blocker.app_id) == (a.id, "holder")
        assert "app 'holder'" in str(caught.value)
        started = time.monotonic()
        with pytest.raises(LockTimeout, match=r"not granted within 0\.3 s"):
            b.lock("x", timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 2
        assert store.waiters() == []  # the timed-out waiter left nothing
        held.release()


def test_permits_cap_each_mode(store: Store) -> None:
    store.set_permits("pool", read=2, write=2)
    assert store.permits("pool") == lockwarden.store.Permits(read=2, write=2)
    sessions = [store.session(app_id=f"s{i}") for i in range(3)]
    r = [s.try_lock("pool", "read") for s in sessions]
    assert [x is not None for x in r] == [True, True, False]
    assert sessions[2].try_lock("pool", "write") is None  # readers and writers exclude
    for x in r[:2]:
        assert x is not None
        x.release()
    w = [s.try_lock("pool", "write") for s in sessions]
    assert [x is not None for x in w] == [True, True, False]
    assert sessions[2].try_lock("pool", "read") is None
    store.set_permits("pool")  # back to the defaults
    assert store.permits("pool") == lockwarden.store.Permits(read=None, write=1)
    for s in sessions:
        s.close()


def test_permit_change_reaches_a_waiting_client(connect: Callable[..., Store]) -> None:
    admin, client = connect(), connect()
    admin.set_permits("ws1", read=1)
    with client.session(app_id="c1") as c1, client.session(app_id="c2") as c2:
        c1.lock("ws1", "read")
        waiter = Background(lambda: c2.lock("ws1", "read", timeout=10))
        wait_for(lambda: admin.waiters("ws1"), what="the waiter to queue")
        started = time.monotonic()
        admin.set_permits("ws1", read=2, force=True)  # beside the holder: forced
        waiter.result()
        assert time.monotonic() - started < 10


def test_a_reader_does_not_pass_a_waiting_writer(store: Store) -> None:
    r1, w, r2 = (store.session(app_id=app) for app in ("r1", "w", "r2"))
    first = r1.lock("doc", "read")
    writer = Background(lambda: w.lock("doc", "write", timeout=10))
    wait_for(lambda: store.waiters("doc"), what="the writer to queue")
    assert r2.try_lock("doc", "read") is None  # no barging past the writer
    first.release()
    writer.result().release()
    assert r2.try_lock("doc", "read") is not None


def test_fifo_order(store: Store) -> None:
    holder = store.session(app_id="holder")
    first = holder.lock("q")
    order: list[int] = []
    waiters = []
    for i in range(4):
        session = store.session(app_id=f"w{i}")

        def take(session: lockwarden.store.Session = session, i: int = i) -> None:
            with session.lock("q", timeout=20):
                order.append(i)
                time.sleep(0.02)

        waiters.append(Background(take))
        wait_for(lambda i=i: len(store.waiters("q")) == i + 1, what=f"waiter {i} to queue")
    assert [w.app_id for w in store.waiters("q")] == ["w0", "w1", "w2", "w3"]
    first.release()
    for waiter in waiters:
        waiter.result()
    assert order == [0, 1, 2, 3]


def test_multi_lock_is_all_or_nothing(store: Store) -> None:
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        held = a.lock("ws2", "write")
        assert b.try_lock_many([("ws1", "write"), ("ws2", "read")]) is None
        assert store.locks("ws1") == []  # nothing was half granted
        with pytest.raises(LockTimeout):
            b.lock_many([("ws1", "write"), ("ws2", "read")], timeout=0.2)
        assert store.locks("ws1") == [] and store.waiters() == []
        held.release()
        stamp = b.try_lock_many([("ws1", "write"), ("ws2", "read")])
        assert isinstance(stamp, Stamp) and not isinstance(stamp, HeldLock)
        assert set(stamp.tokens) == {"ws1", "ws2"}
        assert {(e.name, e.mode) for e in store.locks()} == {("ws1", Mode.X), ("ws2", Mode.S)}
        stamp.check()
        b.release(stamp)
        assert store.locks() == []
        with pytest.raises(NotHeld):
            b.release(stamp)


def test_multi_lock_waits_for_all(store: Store) -> None:
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        one, two = a.lock("m1"), a.lock("m2")
        waiter = Background(lambda: b.lock_many([("m1", "write"), ("m2", "write")], timeout=10))
        wait_for(lambda: len(store.waiters()) == 2, what="both queue entries")
        one.release()
        time.sleep(0.1)
        assert {e.name for e in store.locks()} == {"m2"}  # still nothing granted to b
        two.release()
        stamp = waiter.result()
        assert {e.name for e in store.locks()} == {"m1", "m2"}
        stamp.release()


def test_release_rules(connect: Callable[..., Store]) -> None:
    store = connect()
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        stamp = a.lock_many([("r1", "write")])
        with pytest.raises(NotHeld, match="another session"):
            b.release(stamp)
        assert len(store.locks()) == 1  # untouched
        a.release(stamp)
        with pytest.raises(NotHeld, match="already released"):
            a.release(stamp)
        with pytest.raises(NotHeld):
            stamp.check()


def test_a_release_cut_short_once_the_stamp_left_the_session_is_seen_through(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in a release after the stamp left the session's stamps and before the
    database confirmed it (here as the backend's call starts): the caller gets the
    interrupt, and the release is sent again in the background until the lock is free.
    A release refused before that point (NotHeld) leaves nothing to retry."""
    backend = store._backend  # type: ignore[attr-defined]
    sent = backend.release

    def interrupted(*args: object) -> int:
        monkeypatch.setattr(backend, "release", sent)  # the retry goes through
        raise KeyboardInterrupt

    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        held = a.lock("x")
        monkeypatch.setattr(backend, "release", interrupted)
        with pytest.raises(KeyboardInterrupt):
            held.release()
        assert a.held == []
        b.lock("x", timeout=10).release()  # freed by the background retry
        wait_for(lambda: a.releasing == 0, what="the release to be confirmed")
        with pytest.raises(NotHeld, match="already released"):
            held.release()
        assert a.releasing == 0


def test_close_releases_everything(store: Store) -> None:
    s = store.session(app_id="a")
    s.lock("c1")
    s.lock_many([("c2", "read"), ("c3", "write")])
    assert len(store.locks()) == 3
    s.close()
    assert store.locks() == []
    with pytest.raises(LockUsageError, match="closed"):
        s.lock("c1")


def test_break_lock_fences_off_the_holder(store: Store) -> None:
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        lk = a.lock("brk")
        assert store.break_lock("brk") == 1
        with pytest.raises(LockLost):
            lk.check()
        again = b.lock("brk", timeout=1)
        assert again.token > lk.token
        with pytest.raises(LockLost):
            lk.release()  # nothing of b's was deleted
        assert [e.token for e in store.locks("brk")] == [again.token]


def test_release_all_by_app(store: Store) -> None:
    lost: list[LockLost] = []
    billing = store.session(app_id="billing", ttl=1.0, on_lost=lost.append)
    other = store.session(app_id="other")
    billing.lock("b1")
    billing.lock("b2", "read")
    other.lock("o1")
    assert store.release_all(app_id="billing") == 0  # alive: left alone unless forced
    assert store.release_all(app_id="billing", force=True) == 2
    assert [e.name for e in store.locks()] == ["o1"]
    wait_for(lambda: lost, what="on_lost")
    assert billing.lost
    billing.close()
    other.close()


def test_stale_holder_is_reclaimed_with_a_new_token(store: Store) -> None:
    dead = store.session(app_id="dead", ttl=0.5)
    old = dead.lock("job")
    stop_heartbeat(dead)
    with store.session(app_id="live") as live:
        started = time.monotonic()
        new = live.lock("job", timeout=5)
        assert time.monotonic() - started < 0.5 + 0.5 + lease_slack(store)
        assert new.token > old.token
        assert [e.token for e in store.locks("job")] == [new.token]
        with pytest.raises(LockLost):
            old.check()
        with pytest.raises(LockLost):
            old.release()
        new.check()  # untouched by the old holder's release


def test_refuse_policy_reports_the_holder_and_leaves_the_lock(store: Store) -> None:
    dead = store.session(app_id="frozen", ttl=0.3)
    dead.lock("schema")
    stop_heartbeat(dead)
    time.sleep(0.4)
    with store.session(app_id="live") as live:
        with pytest.raises(HolderUnresponsive) as caught:
            live.lock("schema", timeout=5, on_stale="refuse")
        holder = caught.value.holder
        assert holder is not None and holder.app_id == "frozen"
        assert str(holder.pid) in str(caught.value) and holder.host in str(caught.value)
        assert "lockwarden break schema" in str(caught.value)
        [entry] = store.locks("schema")
        assert entry.stale and entry.holder.session_id == dead.id
        assert store.waiters() == []


def test_a_waiter_refuses_a_holder_that_dies_while_it_waits(connect: Callable[..., Store]) -> None:
    store = connect(on_stale="refuse")
    dead = store.session(app_id="frozen", ttl=0.5)
    dead.lock("schema")
    with store.session(app_id="live") as live:
        waiter = Background(lambda: live.lock("schema", timeout=10))
        time.sleep(0.2)
        stop_heartbeat(dead)
        with pytest.raises(HolderUnresponsive):
            waiter.result()
        assert len(store.locks("schema")) == 1


def test_max_hold_makes_waiters_fail_fast(connect: Callable[..., Store]) -> None:
    store = connect(max_hold=0.3)
    with store.session(app_id="slow") as slow, store.session(app_id="w") as w:
        slow.lock("long")
        waiting = Background(lambda: w.lock("long", timeout=10))
        with pytest.raises(HeldTooLong) as caught:  # fails when the hold passes max_hold
            waiting.result()
        assert caught.value.holder is not None and caught.value.holder.app_id == "slow"
        started = time.monotonic()
        with pytest.raises(HeldTooLong, match="max_hold"):
            w.lock("long", timeout=10)
        assert time.monotonic() - started < 1  # at once, no waiting
        assert store.waiters() == []


def test_crossing_sessions_get_exactly_one_deadlock(store: Store) -> None:
    a, b = store.session(app_id="a"), store.session(app_id="b")
    a.lock("L1")
    b.lock("L2")
    barrier = threading.Barrier(2)

    def cross(s: lockwarden.store.Session, other: str, mine: str) -> str:
        barrier.wait()
        try:
            got = s.lock(other, timeout=10)
        except Deadlock as exc:
            assert set(exc.cycle) == {a.id, b.id}
            s.release(next(st for st in s.held if st.locks[0].name == mine))
            return "deadlock"
        got.release()
        return "granted"

    ta = Background(lambda: cross(a, "L2", "L1"))
    tb = Background(lambda: cross(b, "L1", "L2"))
    assert sorted([ta.result(), tb.result()]) == ["deadlock", "granted"]
    a.close()
    b.close()


def test_shared_lock_behaves_like_threading_lock(store: Store) -> None:
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        mine, theirs = a.Lock("tl"), b.Lock("tl")
        assert not mine.locked()
        assert mine.acquire() is True
        assert mine.locked() and theirs.locked()
        assert mine.token is not None
        assert theirs.acquire(blocking=False) is False
        assert theirs.acquire(timeout=0.1) is False
        assert mine.acquire(timeout=0.1) is False  # not reentrant: waits, like threading.Lock
        with pytest.raises(ValueError):
            theirs.acquire(blocking=False, timeout=1)
        mine.release()
        with pytest.raises(NotHeld):
            mine.release()
        with theirs:
            assert theirs.locked()
        assert not mine.locked()


def test_clean_removes_dead_sessions(store: Store) -> None:
    dead = store.session(app_id="dead", ttl=0.3)
    dead.lock("d1")
    stop_heartbeat(dead)
    with store.session(app_id="live") as live:
        live.lock("d2")
        wait_for(
            lambda: any(e.stale for e in store.locks()), what="the silent session's lock stale"
        )
        [stale] = [e for e in store.locks() if e.stale]
        assert stale.name == "d1"
        cleaned = store.clean()
        assert (cleaned.sessions, cleaned.locks, cleaned.waiters) == (1, 1, 0)
        assert cleaned._asdict() == {"sessions": 1, "locks": 1, "waiters": 0}  # as clean --json
        assert cleaned.holders == cleaned.locks  # the old name still reads
        assert [e.name for e in store.locks()] == ["d2"]


def test_cleaned_is_built_by_its_new_and_its_old_names() -> None:
    assert Cleaned(1, 2, 3) == Cleaned(sessions=1, locks=2, waiters=3)
    assert Cleaned(sessions=1, holders=2, waiters=3) == (1, 2, 3)
    assert repr(Cleaned(1, 2, 3)) == "Cleaned(sessions=1, locks=2, waiters=3)"
    assert pickle.loads(pickle.dumps(Cleaned(1, 2, 3))) == Cleaned(1, 2, 3)
    sessions, locks, waiters = Cleaned(1, 2, 3)._replace(locks=5)
    assert (sessions, locks, waiters) == (1, 5, 3)
    with pytest.raises(TypeError, match="locks \\(or holders, its old name\\)"):
        Cleaned(1, 2, 3, holders=2)


def test_every_lock_taken_over_from_a_dead_holder_is_counted_once(store: Store) -> None:
    """The store-wide count behind ``lockwarden_reclaimed_locks_total``: one per dead holder's
    lock an acquirer removes, granted or not; a retried attempt counts nothing again, and
    what `clean` and `break_lock` remove is no reclaim."""
    assert store.reclaimed_count() == 0
    # A TTL long enough for the five durable locks below to be taken while the sessions
    # still beat, on a slow disk too (0.3 s was seen lost under a loaded CI run).
    readers = [store.session(app_id=f"dead-{i}", ttl=1.0) for i in range(3)]
    for reader in readers:
        reader.lock("shared", mode="read")
    readers[0].lock("single")
    readers[1].lock("behind", mode="read")
    readers[2].lock("left")
    for reader in readers:
        stop_heartbeat(reader)
    with store.session(app_id="live") as live, store.session(app_id="reader") as reader:
        reader.lock("behind", mode="read")
        victim = store.session(app_id="victim")
        victim.lock("broken")
        wait_for(lambda: sum(e.stale for e in store.locks()) == 6, what="the dead locks stale")
        request = AcquireRequest(live.id, "taken", ("shared", "single"), ("X", "X"), True, False, 5)
        first = store._backend.acquire(request)
        assert (first.status, first.reclaimed) == ("granted", True)
        assert store.reclaimed_count() == 4  # three readers of "shared", one of "single"
        again = store._backend.acquire(request)  # what a resent attempt sends
        assert (again.status, again.tokens) == ("granted", first.tokens)
        assert store.reclaimed_count() == 4
        assert live.try_lock("behind") is None  # the dead reader goes, the live one stays
        assert store.reclaimed_count() == 5
        assert store.break_lock("broken") == 1
        assert store.clean().locks == 1  # "left"
        assert store.reclaimed_count() == 5
        victim.close()


def test_lost_session_refuses_new_locks(store: Store) -> None:
    lost: list[LockLost] = []
    s = store.session(app_id="a", ttl=0.3, on_lost=lost.append)
    lk = s.lock("z")
    stop_heartbeat(s)
    time.sleep(0.35)
    resume_heartbeat(s)
    with pytest.raises(LockLost):
        lk.check()
    with pytest.raises(LockLost):
        s.lock("other")
    wait_for(lambda: lost, what="on_lost")
    assert len(lost) == 1
    s.close()
    assert store.locks() == []


def test_a_retried_attempt_is_recognised_not_granted_twice(store: Store) -> None:
    """What a retry after a dropped connection sends: the same request id, again."""
    with store.session(app_id="a") as s, store.session(app_id="b") as other:
        request = AcquireRequest(s.id, "retry-1", ("p", "q"), ("X", "S"), True, False, None)
        first = store._backend.acquire(request)
        again = store._backend.acquire(request)
        assert first.status == again.status == "granted"
        assert again.tokens == first.tokens
        assert len(store.locks()) == 2
        # a retried enqueue keeps its place in the queue
        queued = AcquireRequest(other.id, "retry-2", ("p",), ("X",), True, False, None)
        assert store._backend.acquire(queued).status == "blocked"
        assert store._backend.acquire(queued).status == "blocked"
        assert [w.session_id for w in store.waiters()] == [other.id]


@pytest.mark.slow
def test_multi_locks_are_never_partly_granted_under_contention(store: Store) -> None:
    """Workers take random sets of names; a watcher never sees a set half held."""
    names = ["n1", "n2", "n3", "n4"]
    stop = threading.Event()
    current: dict[str, tuple[int, frozenset[str]]] = {}  # session -> (version, names asked)
    exclusive_ok = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        with store.session(app_id=f"w{seed}") as s:
            version = 0
            while not stop.is_set():
                chosen = frozenset(rng.sample(names, rng.randint(1, 3)))
                version += 1
                current[s.id] = (version, chosen)
                try:
                    stamp = s.lock_many([(n, "write") for n in sorted(chosen)], timeout=2)
                except LockTimeout:
                    continue
                holders = {e.name: e.holder.session_id for e in store.locks()}
                exclusive_ok.append(all(holders.get(n) == s.id for n in chosen))
                time.sleep(rng.uniform(0, 0.005))
                stamp.release()

    workers = [Background(lambda seed=seed: work(seed)) for seed in range(4)]
    snapshots = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        asked_before = dict(current)
        held: dict[str, set[str]] = {}
        for entry in store.locks():
            held.setdefault(entry.holder.session_id, set()).add(entry.name)
        asked_after = dict(current)
        for session_id, got in held.items():
            if asked_before.get(session_id) == asked_after.get(session_id):
                assert got == set(asked_after[session_id][1])  # all of the set, or none
                snapshots += 1
    stop.set()
    for worker in workers:
        worker.result()
    assert snapshots > 20 and exclusive_ok and all(exclusive_ok)


def test_max_hold_is_off_unless_asked_for(store: Store) -> None:
    """As in the command line: a waiter without a timeout waits as long as the holder lives."""
    assert store.max_hold is None
    with store.session(app_id="slow") as slow, store.session(app_id="w") as w:
        held = slow.lock("long")
        waiting = Background(lambda: w.lock("long"))
        time.sleep(0.3)
        held.release()
        waiting.result().release()


def test_a_shared_lock_shared_by_threads_is_a_threading_lock(store: Store) -> None:
    with store.session(app_id="t") as s:
        lock = s.Lock("threads")
        assert lock.acquire()
        # Another thread: a try fails, a timed acquire times out, a blocking one waits.
        assert Background(lambda: lock.acquire(False)).result() is False
        started = time.monotonic()
        assert Background(lambda: lock.acquire(timeout=0.2)).result() is False
        assert time.monotonic() - started >= 0.2
        waiting = Background(lock.acquire)
        time.sleep(0.2)
        assert waiting.is_alive()
        lock.release()  # any thread may release, as with threading.Lock
        assert waiting.result() is True
        assert lock.locked() and lock.owned()
        Background(lock.release).result()
        assert not lock.locked() and not lock.owned()
        assert store.locks("threads") == []


def test_threads_sharing_a_shared_lock_exclude_each_other(store: Store) -> None:
    with store.session(app_id="t") as s:
        lock = s.Lock("counter")
        inside: list[int] = []
        overlaps: list[int] = []

        def work() -> None:
            for _ in range(5):
                with lock:
                    inside.append(1)
                    if len(inside) > 1:
                        overlaps.append(1)
                    time.sleep(0.002)
                    inside.pop()

        for t in [Background(work) for _ in range(4)]:
            t.result()
        assert overlaps == []
        assert store.locks("counter") == []


def test_extend_renews_the_session_lease_now(store: Store) -> None:
    with store.session(app_id="t", ttl=3) as s:
        held = s.lock("lease")
        first = held.expires_at
        assert first is not None and time.time() < first <= time.time() + 3
        time.sleep(0.1)
        renewed = held.extend()
        assert renewed > first  # a heartbeat just now: the deadline moved on
        assert held.expires_at is not None and held.expires_at >= renewed - 0.01
        assert held.owned() and held.locked()
        stop_heartbeat(s)
        other = store.session(app_id="o")
        deadline = time.monotonic() + 10
        while other.try_lock("lease") is None:  # nobody renews: the lock passes on
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not held.owned()
        with pytest.raises(LockLost):
            held.extend()
        assert held.expires_at is None
        other.close()


def test_owned_and_extend_after_release_or_break(store: Store) -> None:
    with store.session(app_id="t") as s:
        held = s.lock("gone")
        assert store.break_lock("gone") == 1
        assert not held.owned() and not held.locked()
        with pytest.raises(LockLost):
            held.extend()
        with pytest.raises(LockLost):
            held.release()
        again = s.lock("gone")
        again.release()
        assert not again.owned() and again.expires_at is None
        with pytest.raises(NotHeld):
            again.extend()
        shared = s.Lock("gone")
        assert shared.expires_at is None and not shared.owned()
        with pytest.raises(NotHeld):
            shared.extend()
        with shared:
            assert shared.expires_at is not None
            assert shared.extend() > time.time()


def test_waiters_giving_up_at_any_moment_leak_no_grant(store: Store) -> None:
    """Waiters with short timeouts race the releases that grant them: one that gives up as
    it is granted must give the grant back, or the lock would stay held by nobody's code."""
    inside: list[int] = []
    overlaps: list[int] = []
    stop = time.monotonic() + 3.0

    def worker(seed: int) -> int:
        rng = random.Random(seed)
        got = 0
        with store.session(app_id=f"g{seed}", ttl=30) as s:
            while time.monotonic() < stop:
                try:
                    held = s.lock("giveup", timeout=rng.choice([0.0, 0.001, 0.005, 0.02, 0.1]))
                except LockTimeout:
                    continue
                inside.append(seed)
                if len(inside) > 1:
                    overlaps.append(len(inside))
                time.sleep(rng.random() * 0.005)
                inside.remove(seed)
                held.release()
                got += 1
        return got

    workers = [Background(lambda i=i: worker(i)) for i in range(6)]
    assert sum(w.result() for w in workers) > 0
    assert overlaps == []
    assert store.locks("giveup") == [] and store.waiters("giveup") == []
    with store.session(app_id="after") as s:
        s.lock("giveup", timeout=1).release()  # nothing was left holding it


def test_locking_a_name_the_caller_already_holds_fails_at_once(store: Store) -> None:
    with store.session(app_id="a") as s:
        held = s.lock("job", "read")
        for again in (
            lambda: s.lock("job", timeout=None),
            lambda: s.lock("job", "write", timeout=5),
            lambda: s.try_lock("job", "read"),
            lambda: s.lock_many([("other", "write"), ("job", "read")]),
        ):
            started = time.monotonic()
            with pytest.raises(LockUsageError, match="already holds read lock on 'job'") as err:
                again()
            assert time.monotonic() - started < 1.0
            assert f"(token {held.token})" in str(err.value)
            assert "not reentrant" in str(err.value)
        assert store.waiters() == []
        assert [e.token for e in store.locks()] == [held.token]
        # A lock the holder has learnt is gone (broken) may be asked for again.
        store.break_lock("job")
        with pytest.raises(LockLost):
            held.check()
        held = s.lock("job", "read", timeout=5)
        # Another thread of the session waits for it, as for anyone's lock.
        waiting = Background(lambda: s.lock("job", "write", timeout=10))
        wait_for(lambda: store.waiters("job"), what="the other thread to queue")
        held.release()
        waiting.result().release()
