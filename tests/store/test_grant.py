"""Grant on release: the release lets the compatible heads of the queue in.

Waiters are queued here through the backend, without a thread waiting, so that what the
release itself granted can be read from the store the moment it returns. On etcd a
release grants one single-name request at most, and only when it releases one name
(`backends/etcd/README.md`, "Grant on release"): the others it lets in take their locks when woken.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Sequence

import pytest

import lockwarden
from lockwarden import Deadlock, LockLost, LockTimeout
from lockwarden.store import Session, Store, waiting
from lockwarden.store.backends.base import AcquireRequest, Run
from lockwarden.store.backends.postgresql.backend import PostgresBackend
from lockwarden.store.backends.sql import algorithm as attempt
from lockwarden.store.backends.sql.algorithm import Engine
from lockwarden.store.wakeups import Subscription, Told
from tests.conftest import (
    Background,
    Child,
    enqueue,
    lease_slack,
    pg_admin,
    stop_heartbeat,
    wait_for,
)


@pytest.fixture(params=["pg_url", "sqlite_url", "mysql_url", "etcd_url"])
def url(request: pytest.FixtureRequest) -> str:
    value: str = request.getfixturevalue(request.param)
    return value


@pytest.mark.parametrize("backend", ["pg_url", "mysql_url", "sqlite_url"])
def test_a_release_nobody_waits_for_is_one_round_trip_and_one_with_a_waiter_grants(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """A release of a calm name deletes its grant only if nobody waits, in the round trip
    that commits; where someone does (queued through another store, so this one has not
    seen the name fought over), it changes nothing, and the full release grants: one
    statement more than the release of a name seen fought over, which goes the full way
    at once."""
    url = request.getfixturevalue(backend)
    store, other = lockwarden.connect(url), lockwarden.connect(url)

    def handed_over(fought: bool) -> int:
        """Statements of a release that grants the waiter queued behind it, on a name the
        store has seen ``fought`` over or not."""
        lock = holder.lock("calm")
        queued = enqueue(waiter, {"calm": "X"})
        store._backend._contended.note(["calm"], fought)
        before = store.stats["statements"]
        lock.release()
        sent = store.stats["statements"] - before
        assert [(e.holder.app_id, e.token > lock.token) for e in store.locks("calm")] == [
            ("waiter", True)
        ]
        assert store.waiters("calm") == []
        other._backend.release(waiter.id, queued, ["calm"])
        return sent

    try:
        holder, waiter = store.session(app_id="holder"), other.session(app_id="waiter")
        lock = holder.lock("calm")
        before = store.stats["statements"]
        lock.release()
        assert store.stats["statements"] - before == 1
        assert store.locks("calm") == []
        assert handed_over(fought=False) == handed_over(fought=True) + 1  # the try
    finally:
        store.close()
        other.close()


def grants_one(store: Store) -> bool:
    """Whether a release grants one waiting request at most, waiting for one name, and only
    when it releases one name (etcd: each grant has a transaction, and a token, of its own);
    the others it lets in are woken, and attempt."""
    return store.url.startswith("etcd:")


def attempt_again(session: Session, request_id: str, items: dict[str, str]) -> str:
    """The attempt of a queued request that a wake-up sends; its outcome."""
    names, modes = tuple(items), tuple(items.values())
    request = AcquireRequest(session.id, request_id, names, modes, True, False, None, True)
    return session._backend.acquire(request).status


def holders(store: Store, name: str) -> list[tuple[str, str]]:
    return [(e.holder.app_id, e.mode.value) for e in store.locks(name)]


def queued(store: Store, name: str) -> list[str]:
    return [w.app_id for w in store.waiters(name)]


def test_readers_at_the_head_share_the_grant_and_a_writer_waits(store: Store) -> None:
    h, r1, r2, w3, r4 = (store.session(app_id=a) for a in ("h", "r1", "r2", "w3", "r4"))
    held = h.lock("doc")
    ids = {
        s.app_id: enqueue(s, {"doc": m}) for s, m in ((r1, "S"), (r2, "S"), (w3, "X"), (r4, "S"))
    }
    subs = {app: Subscription(frozenset(), request_id) for app, request_id in ids.items()}
    for sub in subs.values():
        store._backend.wakeups.add(sub)
    if store.url.startswith("postgresql"):
        # As if the waiters ran on another machine: told by NOTIFY, which a test can hear.
        store._backend._near = b"another machine/"
        with pg_admin() as listener:
            listener.execute(f"LISTEN lw_{r1.id[-16:]}")
            held.release()
            notes = sorted(n.payload.split()[0] for n in listener.notifies(timeout=1.0))
        assert notes == sorted([ids["r1"], ids["r2"]])  # exactly the granted, nobody else
    else:
        held.release()
    if grants_one(store):
        assert holders(store, "doc") == [("r1", "S")]
        assert attempt_again(r2, ids["r2"], {"doc": "S"}) == "granted"
    assert holders(store, "doc") == [("r1", "S"), ("r2", "S")]
    assert queued(store, "doc") == ["w3", "r4"]
    tokens = {e.holder.app_id: (e.token,) for e in store.locks("doc")}
    for app in ("r1", "r2"):  # the granted are told their tokens: they hold the lock
        assert subs[app].wait(5.0) == tokens[app]
    for app in ("w3", "r4"):
        assert not isinstance(subs[app].wait(0.1), tuple)  # granted nothing
    assert store._backend.release(r1.id, ids["r1"], ["doc"]) == 1
    assert holders(store, "doc") == [("r2", "S")]  # the writer still waits for r2
    store._backend.release(r2.id, ids["r2"], ["doc"])
    assert holders(store, "doc") == [("w3", "X")]
    store._backend.release(w3.id, ids["w3"], ["doc"])
    assert holders(store, "doc") == [("r4", "S")]
    assert queued(store, "doc") == []


def test_tokens_of_grants_on_release_keep_growing(store: Store) -> None:
    h, w = store.session(app_id="h"), store.session(app_id="w")
    held = h.lock("tok")
    request = enqueue(w, {"tok": "X"})
    held.release()
    [entry] = store.locks("tok")
    assert entry.token > held.token
    store._backend.release(w.id, request, ["tok"])
    assert h.lock("tok").token > entry.token


def test_permit_caps_bound_the_grant(store: Store) -> None:
    store.set_permits("pool", read=2)
    h = store.session(app_id="h")
    held = h.lock("pool")
    sessions = {app: store.session(app_id=app) for app in ("a", "b", "c")}
    ids = {app: enqueue(s, {"pool": "S"}) for app, s in sessions.items()}
    held.release()
    if grants_one(store):
        assert holders(store, "pool") == [("a", "S")]
        for app in ("b", "c"):
            attempt_again(sessions[app], ids[app], {"pool": "S"})
    assert holders(store, "pool") == [("a", "S"), ("b", "S")]
    assert queued(store, "pool") == ["c"]


def test_a_write_cap_above_one_lets_as_many_writers_in(store: Store) -> None:
    h = store.session(app_id="h")
    held = h.lock("pair")
    sessions = {app: store.session(app_id=app) for app in ("a", "b", "c")}
    ids = {app: enqueue(s, {"pair": "X"}) for app, s in sessions.items()}
    store.set_permits("pair", write=2, force=True)
    held.release()
    if grants_one(store):
        assert holders(store, "pair") == [("a", "X")]
        for app in ("b", "c"):
            attempt_again(sessions[app], ids[app], {"pair": "X"})
    assert holders(store, "pair") == [("a", "X"), ("b", "X")]
    assert queued(store, "pair") == ["c"]


def test_a_dead_holder_left_on_the_name_keeps_a_writer_queued(store: Store) -> None:
    """The release's grant never reclaims: the waiter does, under its own stale policy."""
    dead, r, w = (store.session(app_id=a, ttl=0.6) for a in ("dead", "r", "w"))
    dead.lock("left", "read")
    held = r.lock("left", "read")
    enqueue(w, {"left": "X"})
    stop_heartbeat(dead)
    time.sleep(0.8)  # dead is stale, but nobody has reclaimed its lock yet
    held.release()
    assert holders(store, "left") == [("dead", "S")]
    assert queued(store, "left") == ["w"]


def test_a_multi_lock_waiter_is_granted_all_or_nothing(store: Store) -> None:
    h1, h2, m, s = (store.session(app_id=a) for a in ("h1", "h2", "m", "s"))
    on_a, on_b = h1.lock("ma"), h2.lock("mb")
    multi = enqueue(m, {"ma": "X", "mb": "X"})
    single = enqueue(s, {"ma": "X"})
    on_a.release()
    assert store.locks("ma") == [] and holders(store, "mb") == [("h2", "X")]
    assert queued(store, "ma") == ["m", "s"]  # FIFO: s stays behind the multi-lock
    on_b.release()
    if grants_one(store):
        assert store.locks("ma") == store.locks("mb") == []  # nobody passes the multi-lock
        assert attempt_again(m, multi, {"ma": "X", "mb": "X"}) == "granted"
    assert holders(store, "ma") == [("m", "X")] and holders(store, "mb") == [("m", "X")]
    store._backend.release(m.id, multi, ["ma", "mb"])
    if grants_one(store):
        assert store.locks("ma") == []
        assert attempt_again(s, single, {"ma": "X"}) == "granted"
    assert holders(store, "ma") == [("s", "X")] and store.locks("mb") == []


def test_waiters_of_dead_sessions_or_past_their_deadline_are_passed_over(store: Store) -> None:
    h, dead, late, live = (store.session(app_id=a, ttl=0.6) for a in ("h", "dead", "late", "live"))
    held = h.lock("skip")
    enqueue(dead, {"skip": "X"})
    enqueue(late, {"skip": "X"}, wait=0.3)
    enqueue(live, {"skip": "X"})
    stop_heartbeat(dead)
    time.sleep(0.8 + lease_slack(store))  # dead is stale, late's wait is over
    held.release()
    assert holders(store, "skip") == [("live", "X")]


def test_abandoning_a_request_gives_back_a_grant_made_meanwhile(store: Store) -> None:
    """A waiter that times out or is cancelled as a release grants it: its abandon (the
    release call) deletes the grant and passes the lock on."""
    h, gone, next_ = (store.session(app_id=a) for a in ("h", "gone", "next"))
    held = h.lock("race")
    abandoned = enqueue(gone, {"race": "X"})
    enqueue(next_, {"race": "X"})
    held.release()
    assert holders(store, "race") == [("gone", "X")]
    assert store._backend.release(gone.id, abandoned, ["race"]) == 1
    assert holders(store, "race") == [("next", "X")]


def test_a_waiter_giving_up_at_the_head_of_a_free_name_lets_the_next_one_in(
    store: Store,
) -> None:
    """The name was freed without a grant (an administrator broke the lock) and the head
    of its queue gives up before it looks: its release lets the next waiter in, and
    never grants the request it removes."""
    h, gone, next_ = (store.session(app_id=a) for a in ("h", "gone", "next"))
    h.lock("head")
    abandoned = enqueue(gone, {"head": "X"})
    enqueue(next_, {"head": "X"})
    store.break_lock("head")
    store._backend.release(gone.id, abandoned, ["head"])
    assert holders(store, "head") == [("next", "X")]
    assert queued(store, "head") == []


def test_a_grant_that_completes_a_cycle_is_still_refused(store: Store) -> None:
    """a holds L1 and waits for L2 behind s's request; s then waits for L1 while holding
    nothing (no check then). When the release of L2 grants s, a must look again: its
    attempt finds the cycle."""
    h, a, s = (store.session(app_id=x, ttl=30) for x in ("h", "a", "s"))
    on_l2 = h.lock("L2")
    with pytest.raises(LockTimeout):  # the listener starts now, not while a waits
        a.lock("L2", timeout=0.1)
    a.lock("L1")
    enqueue(s, {"L2": "X"})
    waiting = Background(lambda: a.lock("L2", timeout=20))
    wait_for(lambda: len(store.waiters("L2")) == 2, what="a to queue behind s")
    time.sleep(0.3)  # a has made its attempts: it waits, and looks again only when told
    enqueue(s, {"L1": "X"})
    on_l2.release()
    with pytest.raises(Deadlock):
        waiting.result(timeout=10)


def record_told(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sessions that releases made through ``store`` tell from now on, granted or sent
    to look again, in order: read where each backend decides, before anything is sent."""
    told: list[str] = []
    backend = store._backend
    if isinstance(backend, PostgresBackend):  # decided by lw_grant, poked by _tell
        tell = backend._tell

        def recording_tell(pokes: str | None, resent: Sequence[str]) -> None:
            told.extend(line.partition(" ")[0] for line in (pokes or "").splitlines())
            tell(pokes, resent)

        monkeypatch.setattr(backend, "_tell", recording_tell)
    else:  # SQLite and MySQL: attempt.grant, called by the release
        module = sys.modules[type(backend).__module__]

        def recording_grant(run: Run, released: Sequence[str], engine: Engine) -> list[Told]:
            made = attempt.grant(run, released, engine)
            told.extend(session for _, session, _ in made)
            return made

        monkeypatch.setattr(module, "grant", recording_grant)
    return told


@pytest.mark.parametrize("grantee_waits", [False, True])
def test_a_hand_off_tells_the_holding_waiters_behind_only_if_its_grantee_still_waits(
    store: Store, monkeypatch: pytest.MonkeyPatch, grantee_waits: bool
) -> None:
    """A waiter whose session holds a lock is sent to look again after a hand-off of the
    name it waits for (its attempt runs the deadlock check) only if the new holder's
    session still waits for something: through a session that waits for nothing, a
    grant completes no cycle, and a release need not read every waiter's holdings."""
    if grants_one(store):
        pytest.skip(
            "etcd decides whom a hand-off wakes by its own rule "
            "(src/lockwarden/store/backends/etcd/README.md)"
        )
    holder, one, two = (store.session(app_id=x, ttl=30) for x in ("holder", "one", "two"))
    held = holder.lock("q")
    two.lock("elsewhere")
    if grantee_waits:
        holder.lock("other")
        enqueue(one, {"other": "X"})
    enqueue(one, {"q": "X"})
    enqueue(two, {"q": "X"})
    told = record_told(store, monkeypatch)
    held.release()
    assert holders(store, "q") == [("one", "X")]
    assert told == ([one.id, two.id] if grantee_waits else [one.id])


@pytest.mark.slow
def test_processes_contending_for_one_lock_take_turns(
    url: str, children: Callable[..., Child]
) -> None:
    """Each release hands the lock to the longest waiter, so processes looping on one lock
    take turns (a process that released and asked again at once used to win 2-70 % of
    the grants on SQLite, and on MySQL every release woke every waiting process)."""
    contenders = [children("contender", url, "turns", "4") for _ in range(4)]
    for child in contenders:
        assert child.expect()["event"] == "ready"
    for child in contenders:
        assert child.proc.stdin is not None
        child.proc.stdin.write("go\n")
        child.proc.stdin.flush()
    tokens = [child.expect(timeout=60)["tokens"] for child in contenders]
    order = [who for _, who in sorted((t, i) for i, ts in enumerate(tokens) for t in ts)]
    # Counted once every process has queued: a first attempt may meet SQLite's busy handler.
    start = max(order.index(i) for i in range(len(contenders)))
    steady = order[start:]
    shares = [steady.count(i) / len(steady) for i in range(len(contenders))]
    assert all(0.15 <= share <= 0.35 for share in shares), order
    # Each release hands the lock to the longest waiter, who is never the releaser
    # while three others are queued.
    repeats = sum(a == b for a, b in itertools.pairwise(steady))
    assert repeats <= 0.05 * len(steady), order


@pytest.mark.parametrize("entry", ["first attempt", "waiting loop"])
def test_a_multi_lock_partly_taken_back_before_its_waiter_looked_is_lost_and_given_back(
    store: Store, entry: str
) -> None:
    """A release grants both names; one is broken before the waiter learns of its grant.
    The waiter's next look finds half a grant: `LockLost`, and the other half given back
    (it used to report the grant with a token missing, a KeyError in the caller). The
    look is either a first attempt that finds its request granted (a retry after a
    dropped connection) or an attempt of the waiting loop."""
    h, m = store.session(app_id="h"), store.session(app_id="m")
    held = h.lock_many([("pa", "write"), ("pb", "write")])
    request_id = enqueue(m, {"pa": "X", "pb": "X"})
    held.release()
    if grants_one(store):
        assert attempt_again(m, request_id, {"pa": "X", "pb": "X"}) == "granted"
    assert holders(store, "pa") == holders(store, "pb") == [("m", "X")]
    store.break_lock("pa")
    want = m._want([("pa", "write"), ("pb", "write")], 5.0, None)._replace(request_id=request_id)
    with pytest.raises(LockLost, match="'pa' had been taken over") as lost:
        if entry == "first attempt":
            waiting.acquire(m._backend, want)
        else:
            waiting.run_sync(waiting.acquire_steps(m._backend, want), m._backend.wakeups)
    assert lost.value.name == "pa"
    assert holders(store, "pb") == [] and queued(store, "pb") == []
    assert m.lock_many([("pa", "write"), ("pb", "write")], timeout=5).release() is None
