"""PostgreSQL failover: a private primary and streaming standby (`tests/store/failover.py`),
the primary killed (SIGKILL to every process of its server) or cut off from the clients
by a frozen proxy, and the standby promoted; clients follow by libpq's multi-host URL
(``target_session_attrs=read-write``).

What docs/operators.md ("Durability against failover") says, and what these tests
found:

- asynchronous replication can lose the last grants and releases: a lost grant leaves
  its holder believing it holds a lock the new primary hands to the next taker; a
  lost release brings the lock back, held by a session that goes on beating (the
  control tests, ``async-durable``);
- with ``durability="relaxed"`` a session notices the new server (its start time) at
  its next heartbeat and declares itself lost — but the lock may pass to another
  taker before that heartbeat: a holder of a lost grant overlaps with it (strict
  xfail);
- synchronous replication with the default durability loses nothing a client was
  told of: a grant or release the standby did not confirm fails with `StoreError`
  within the call timeout, and no two holders overlap;
- tokens after a promotion are above every token handed out before, lost or not —
  unless the lost ones were handed out by a primary that had itself restarted since
  the standby last heard from it (strict xfail);
- fenced writes (`Store.fence`) stay safe in every mode;
- relaxed durability does not notice a crash that PostgreSQL recovers from without a
  new postmaster (a server process killed): grants and token numbers may be
  forgotten and no session is told (strict xfail).

TTL: 6 s. A session survives a failover if a heartbeat is confirmed by the new
primary within 0.9 TTL of the last confirmed one's sending; heartbeats come every
TTL/3 and, failing, about every TTL/6 — so the outage (promotion and reconnecting)
must stay under about half the TTL. Promotion here takes 0.02 to 0.2 s. Every URL
sets ``connect_timeout=2`` (libpq's least): libpq waits that long for each host in
turn, and a primary that is cut off (not refusing) takes that from every new
connection; without it, each host gets its share of the call's time (the last test).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import lockwarden
from lockwarden import LockLost, LockTimeout, NotHeld, StoreError
from lockwarden.store import Session, Store
from lockwarden.store.backends.postgresql.backend import PostgresBackend
from tests.conftest import Background, wait_for
from tests.store.failover import Pair, Server, Told

pytestmark = pytest.mark.slow

TTL = 6.0
CALL_TIMEOUT = 2.0
SCHEMA = "lw_failover"
RANGE = 1 << 40
"""The first token of the range the first grant after a restart or failover moves to."""

MODES = {
    "async-durable": (False, "durable"),
    "async-relaxed": (False, "relaxed"),
    "sync-durable": (True, "durable"),
    "sync-relaxed": (True, "relaxed"),
}
OVERLAP = (
    "with relaxed durability a session learns of the new server only at its next "
    "heartbeat (up to TTL/3 after the promotion, and longer while it retries), while "
    "the new primary, which never saw the lost grant, hands the lock to the next taker "
    "at once: the two hold it together until that heartbeat"
)
NEXT_RANGE_AGAIN = (
    "the token sequence moves to the range after the one the promoted standby "
    "remembers; a primary that restarted (and so moved to that very range) while the "
    "standby was not receiving had handed out tokens there, which are handed out again"
)
CRASH_UNSEEN = (
    "a server process killed makes PostgreSQL reinitialize and recover without a new "
    "postmaster: pg_postmaster_start_time() does not change, so neither the relaxed "
    "sessions nor the token sequence notice that relaxed commits were forgotten"
)


@dataclass
class Opened:
    """The stores a test opened, closed before its servers stop."""

    stores: list[Store] = field(default_factory=list)

    def __call__(self, url: str, durability: str = "durable", **options: Any) -> Store:
        options.setdefault("call_timeout", CALL_TIMEOUT)
        store = lockwarden.connect(url, durability=durability, **options)
        self.stores.append(store)
        return store


@pytest.fixture
def opened(pg_pair: Callable[..., Pair]) -> Iterator[Opened]:
    """Stores to open; closed before `pg_pair` stops the servers (fixtures end in reverse)."""
    found = Opened()
    yield found
    for store in found.stores:
        with contextlib.suppress(StoreError):  # a store whose servers are all gone
            store.close()


@pytest.fixture
def store_log(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[str]]]:
    """The lines lockwarden's store logged at WARNING and above (what a program sees)."""
    caplog.set_level(logging.INFO, logger="lockwarden.store")

    def lines() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "lockwarden.store" and r.levelno >= logging.WARNING
        ]

    yield lines


def url_of(pair: Pair, **options: Any) -> str:
    return pair.url(SCHEMA, connect_timeout="2", **options)


def failover(pair: Pair, how: str = "kill") -> float:
    """Kill (or cut off) the primary and promote the standby: when the primary went
    (`time.monotonic`)."""
    went = time.monotonic()
    if how == "kill":
        pair.kill_primary()
    else:
        pair.fence_primary()
    pair.promote()
    return went


def confirmed_since(session: Session, since: float) -> bool:
    """Whether a heartbeat sent after ``since`` (`time.monotonic`) has been confirmed: the
    lease then reaches past 0.9 TTL after ``since``."""
    return session.lease_left > 0.9 * session.ttl - (time.monotonic() - since)


def one_line_each(lines: list[str]) -> None:
    for line in lines:
        assert "\n" not in line, line


def overlaps(holds: list[tuple[float, float, str]]) -> list[tuple[str, str]]:
    """The pairs of holds (start, end, who) of one exclusive lock that overlap."""
    ordered = sorted(holds)
    return [(a[2], b[2]) for i, a in enumerate(ordered) for b in ordered[i + 1 :] if b[0] < a[1]]


def mode_params(*names: str, xfail: dict[str, str] | None = None) -> list[Any]:
    marks = xfail or {}
    return [
        pytest.param(name, id=name, marks=[pytest.mark.xfail(strict=True, reason=marks[name])])
        if name in marks
        else pytest.param(name, id=name)
        for name in names
    ]


# -- a holder during the promotion ----------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "how"),
    [
        *[(mode, "kill") for mode in MODES],
        ("sync-durable", "fence"),
        ("async-relaxed", "fence"),
    ],
    ids=[*[f"{mode}-kill" for mode in MODES], "sync-durable-fence", "async-relaxed-fence"],
)
def test_a_holder_during_a_promotion(
    pg_pair: Callable[..., Pair],
    opened: Opened,
    store_log: Callable[[], list[str]],
    mode: str,
    how: str,
) -> None:
    """A lock granted well before the failover (the standby has it). With the default
    durability the holder keeps it: its heartbeat finds the new primary and the lock is
    there, with its token. With relaxed durability the session is told at its next
    heartbeat that the server changed (one ``on_lost``), and the lock is free. Either
    way the next grant's token is in the next range. One warning line, at most, for the
    failed heartbeat."""
    sync, durability = MODES[mode]
    pair = pg_pair(sync=sync)
    url = url_of(pair, through_proxy=how == "fence")
    store = opened(url, durability)
    told = Told()
    holder = store.session("holder", ttl=TTL, on_lost=told)
    held = holder.lock("job")
    pair.wait_replayed()
    went = failover(pair, how)
    assert pair.promoted_in is not None and pair.promoted_in < TTL / 2
    other = opened(url)  # a client that connects after the promotion
    if durability == "durable":
        wait_for(lambda: confirmed_since(holder, went), timeout=TTL, what="a heartbeat")
        assert not holder.lost and told.at == []
        assert held.owned()
        assert [(e.token, e.holder.session_id) for e in other.locks("job")] == [
            (held.token, holder.id)
        ]
        held.release()
    else:
        assert told.event.wait(TTL), "the relaxed session was not told of the new server"
        assert told.at[0] - went < TTL / 3 + TTL / 4 + CALL_TIMEOUT
        assert "restarted" in told.why[0]
        assert holder.lost and not held.owned()
        with pytest.raises(LockLost):
            held.release()
    with other.session("taker", ttl=TTL) as taker:
        taken = taker.lock("job", timeout=TTL)
        assert taken.token >= RANGE > held.token
        taken.release()
    time.sleep(0.2)
    assert told.at == [] or len(told.at) == 1
    lines = store_log()
    one_line_each(lines)
    assert len([line for line in lines if "heartbeat" in line]) <= 1, lines


# -- waiters queued during the promotion --------------------------------------------


@pytest.mark.parametrize("mode", mode_params("async-durable", "async-relaxed", "sync-durable"))
def test_waiters_queued_during_a_promotion(
    pg_pair: Callable[..., Pair],
    opened: Opened,
    store_log: Callable[[], list[str]],
    mode: str,
) -> None:
    """Two holders, each with a waiter in a store of its own: one is granted by a poke
    (a release on the same machine), the other by NOTIFY (its releaser treats it as a
    waiter of another machine). The failover comes while both wait. Each waiter either
    is granted after the promotion, with a token of the next range, or fails with one
    `StoreError` (a look it made while no server answered) or, relaxed, `LockLost` (its
    own session told of the new server); nothing is left queued. The
    LISTEN connections of the waiting stores come back. One warning line at most per
    LISTEN connection and per heartbeat."""
    sync, durability = MODES[mode]
    pair = pg_pair(sync=sync)
    url = url_of(pair)
    holders = opened(url, durability)
    holders_far = opened(url, durability)
    assert isinstance(holders_far._backend, PostgresBackend)
    holders_far._backend._near = b"another machine/"  # its grants go by NOTIFY
    one = holders.session("holder-poke", ttl=TTL)
    two = holders_far.session("holder-notify", ttl=TTL)
    held = {"poked": one.lock("poked"), "notified": two.lock("notified")}
    waiting: dict[str, Background] = {}
    waiter_stores: dict[str, Store] = {}
    for name in held:
        waiter_stores[name] = opened(url, durability)
        session = waiter_stores[name].session(f"waiter-{name}", ttl=TTL)
        waiting[name] = Background(lambda s=session, n=name: s.lock(n, timeout=6 * TTL))
    wait_for(lambda: len(holders.waiters()) == 2, what="both waiters to queue")
    for store in waiter_stores.values():
        backend = store._backend
        assert isinstance(backend, PostgresBackend)
        wait_for(lambda b=backend: b.listening, what="LISTEN")
    pair.wait_replayed()
    went = failover(pair)
    if durability == "durable":
        for session in (one, two):
            wait_for(lambda s=session: confirmed_since(s, went), timeout=TTL, what="heartbeat")
        for lock in held.values():
            lock.release()
    else:
        wait_for(lambda: one.lost and two.lost, timeout=TTL, what="the holders to be told")
    outcomes: dict[str, object] = {}
    for name, call in waiting.items():
        try:
            outcomes[name] = call.result(timeout=6 * TTL)
        except (StoreError, LockLost) as exc:
            outcomes[name] = exc
    for name, outcome in outcomes.items():
        if isinstance(outcome, StoreError | LockLost):
            # Failed cleanly: one line (a StoreError says the abandoned request is
            # removed in the background on a line of its own sentence); a relaxed
            # waiter's session may be told of the new server while it waits.
            assert isinstance(outcome, StoreError) or durability == "relaxed", outcome
            assert "\n" not in str(outcome), outcome
            continue
        assert outcome.token >= RANGE, (name, outcome)  # type: ignore[attr-defined]
        if not outcome.session.lost:  # type: ignore[attr-defined]
            assert outcome.owned()  # type: ignore[attr-defined]
            outcome.release()  # type: ignore[attr-defined]
    check = opened(url_of(pair))
    wait_for(lambda: check.waiters() == [], timeout=2 * TTL, what="no waiter left")
    for store in waiter_stores.values():
        backend = store._backend
        assert isinstance(backend, PostgresBackend)
        listening_again = backend.listening or not backend._listener.started
        assert listening_again, "the LISTEN connection did not come back"
    lines = store_log()
    one_line_each(lines)
    # One line at most per waiting store's LISTEN connection and per session.
    assert len([line for line in lines if "LISTEN" in line]) <= len(waiter_stores), lines
    assert len([line for line in lines if "heartbeat" in line]) <= 4, lines


# -- the last instant before the primary dies ---------------------------------------


@pytest.mark.parametrize(
    "mode",
    mode_params(*MODES, xfail={"async-relaxed": OVERLAP, "sync-relaxed": OVERLAP}),
)
def test_a_grant_committed_in_the_last_instant(
    pg_pair: Callable[..., Pair], opened: Opened, mode: str
) -> None:
    """The standby stops hearing from the primary (its WAL sender stopped), a grant is
    made, the primary dies and the standby is promoted; a taker asks at once.

    The promise for relaxed durability and for synchronous replication: the two never
    hold the lock together — the first holder is never told it holds it (synchronous:
    the grant fails with `StoreError`), or is told it lost it before the taker is
    granted. The control (asynchronous, default durability) shows the loss the docs
    describe: the grant is gone, the holder is never told, and it holds beside the
    taker until it asks (``owned()`` False, ``check()`` and ``release()`` raise
    `LockLost`) — or until its fenced write is turned away."""
    sync, durability = MODES[mode]
    pair = pg_pair(sync=sync)
    url = url_of(pair)
    store = opened(url, durability)
    told = Told()
    holder = store.session("holder", ttl=TTL, on_lost=told)
    holder.lock("warm-up").release()
    # Just after a confirmed heartbeat: the next comes TTL/3 later, well after the
    # taker asks (else the holder might be told first by chance).
    deadline = holder.expires_at  # each confirmed heartbeat moves it on by about TTL/3
    wait_for(lambda: holder.expires_at > deadline + 0.5, timeout=TTL, what="a heartbeat")
    pair.hold_back()
    began = time.monotonic()
    holds: list[tuple[float, float, str]] = []
    try:
        held = holder.lock("job")
    except StoreError as exc:  # synchronous: the standby never confirmed the commit
        assert durability == "durable" and sync, exc
        assert "no answer within" in str(exc)
        assert time.monotonic() - began < 2 * CALL_TIMEOUT + 1.0
        held = None
    granted_at = time.monotonic()
    failover(pair)
    with opened(url_of(pair)).session("taker", ttl=TTL) as taker:
        taken = taker.lock("job", timeout=3 * TTL)
        taken_at = time.monotonic()
        assert held is None or taken.token > held.token
        if held is not None:  # until it is told, or a heartbeat on the new primary passed
            wait_for(
                lambda: told.at or confirmed_since(holder, taken_at),
                timeout=TTL,
                what="the holder's next heartbeat",
            )
            time.sleep(0.1)  # on_lost runs in a thread of its own
            stopped = told.at[0] if told.at else time.monotonic()
            holds.append((granted_at, stopped, "holder"))
        holds.append((taken_at, time.monotonic(), "taker"))
        if held is not None and mode == "async-durable":  # the control: the loss shown
            assert told.at == [] and not holder.lost  # never told: its session beats on
            assert overlaps(holds) == [("holder", "taker")]
            assert not held.owned()  # when it asks, it learns
            with pytest.raises(LockLost):
                store.fence("job").write(held, "late")
            with pytest.raises(LockLost):
                held.release()
            taken.release()
            return
        taken.release()
    assert overlaps(holds) == [], f"two holders at once: {holds}"


@pytest.mark.parametrize("mode", mode_params("async-durable", "async-relaxed", "sync-durable"))
def test_a_release_committed_in_the_last_instant(
    pg_pair: Callable[..., Pair], opened: Opened, mode: str
) -> None:
    """A release made after the standby stopped hearing from the primary.

    Relaxed: the holder's session is told at its next heartbeat and expired, and the
    lock passes on then. Synchronous: the release fails with `StoreError` (retried in
    the background), and the retry frees the lock on the new primary. The control
    (asynchronous, default durability): the release is lost, the lock is back on the
    new primary, held by a session that goes on beating and believes it released it —
    the taker times out behind it until that session ends."""
    sync, durability = MODES[mode]
    pair = pg_pair(sync=sync)
    url = url_of(pair)
    store = opened(url, durability)
    told = Told()
    holder = store.session("holder", ttl=TTL, on_lost=told)
    held = holder.lock("job")
    pair.hold_back()
    try:
        held.release()
        believed = True
    except StoreError as exc:
        assert sync and durability == "durable", exc
        assert "retried in the background" in str(exc)
        believed = False
    went = failover(pair)
    taker_store = opened(url_of(pair))
    with taker_store.session("taker", ttl=TTL) as taker:
        if mode == "async-durable":
            assert believed
            with pytest.raises(LockTimeout, match="held by app 'holder'"):
                taker.lock("job", timeout=TTL / 2)
            assert not holder.lost and confirmed_since(holder, went)
            assert [e.holder.session_id for e in taker_store.locks("job")] == [holder.id]
            holder.close()  # only the end of its session frees the lock
            taken = taker.lock("job", timeout=TTL)
        else:
            taken = taker.lock("job", timeout=3 * TTL)
            if durability == "relaxed":
                assert told.at and told.at[0] < time.monotonic()
            else:  # the retry freed the lock; it counts itself done just after
                wait_for(lambda: holder.releasing == 0, what="the resent release to finish")
                assert not holder.lost
        assert taken.token >= RANGE
        taken.release()


def test_a_lock_call_held_up_by_the_synchronous_standby_ends_within_the_call_timeout(
    pg_pair: Callable[..., Pair], opened: Opened
) -> None:
    """The grant waits for the stalled standby and is cut at the call timeout; its
    give-back goes to the background at once (it used to wait behind the same stalled
    commit, the name's lock, for a second call timeout)."""
    pair = pg_pair(sync=True)
    store = opened(url_of(pair))
    holder = store.session("holder", ttl=TTL)
    holder.lock("warm-up").release()
    pair.hold_back()
    began = time.monotonic()
    with pytest.raises(StoreError, match="no answer within"):
        holder.lock("job")
    took = time.monotonic() - began
    pair.kill_primary()
    assert took < CALL_TIMEOUT + 0.5, f"the lock call took {took:.1f} s"


# -- holders through a failover ------------------------------------------------------


def test_no_two_holders_overlap_through_a_failover_with_synchronous_replication(
    pg_pair: Callable[..., Pair], opened: Opened
) -> None:
    """Three processes' worth of stores take one lock in turn (held 50 ms), and the
    primary dies in the middle. Each records its holding interval on the monotonic
    clock, from the grant to the moment it stops acting (its release, or ``on_lost``).
    No two intervals overlap, and the lock is taken again after the promotion, with
    tokens of the next range."""
    pair = pg_pair(sync=True)
    url = url_of(pair)
    holds: list[tuple[float, float, str]] = []
    tokens: list[tuple[float, int]] = []
    errors: list[str] = []
    stop = threading.Event()
    mutex = threading.Lock()

    def work(who: str) -> None:
        store = opened(url)
        told = Told()
        session = store.session(who, ttl=TTL, on_lost=told)
        while not stop.is_set():
            if session.lost:
                told = Told()
                try:
                    session = store.session(who, ttl=TTL, on_lost=told)
                except StoreError as exc:
                    errors.append(str(exc))
                    time.sleep(0.1)
                    continue
            try:
                held = session.lock("w", timeout=1.0)
            except (StoreError, LockTimeout, LockLost) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            start = time.monotonic()
            told.event.wait(0.05)  # hold, stopping at once if told the lock is lost
            end = told.at[0] if told.at else time.monotonic()
            with mutex:
                holds.append((start, end, who))
                tokens.append((start, held.token))
            try:
                held.release()
            except (StoreError, LockLost) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(3)]
    for worker in workers:
        worker.start()
    time.sleep(1.0)
    went = failover(pair)
    time.sleep(2.5)
    stop.set()
    for worker in workers:
        worker.join(30)
    assert overlaps(holds) == [], holds
    before = [token for at, token in tokens if at < went]
    after = [token for at, token in tokens if at > went + (pair.promoted_in or 0)]
    assert before and after, (len(before), len(after))
    assert min(after) >= RANGE > max(before)
    for message in errors:
        assert "\n" not in message, message


# -- tokens -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", mode_params(*MODES))
def test_tokens_after_a_promotion_exceed_every_token_handed_out_before(
    pg_pair: Callable[..., Pair], opened: Opened, mode: str
) -> None:
    """Grants the standby never saw (asynchronous, or relaxed) hand out tokens it does
    not remember; the first grant after the promotion moves the sequence to the next
    range, above all of them."""
    sync, durability = MODES[mode]
    pair = pg_pair(sync=sync)
    store = opened(url_of(pair), durability)
    before: list[int] = []
    with store.session("before", ttl=TTL) as session:
        for _ in range(3):
            lock = session.lock("t")
            before.append(lock.token)
            lock.release()
        if not (sync and durability == "durable"):  # a synchronous grant would wait
            pair.hold_back()
            for _ in range(40):
                lock = session.lock("t")
                before.append(lock.token)
                lock.release()
        failover(pair)
    after = opened(url_of(pair), durability)
    with after.session("after", ttl=TTL) as session:
        tokens = []
        for name in ("t", "u", "t"):
            lock = session.lock(name)
            tokens.append(lock.token)
            lock.release()
    assert tokens == sorted(tokens) and min(tokens) > max(before)


@pytest.mark.xfail(strict=True, reason=NEXT_RANGE_AGAIN)
def test_tokens_after_a_promotion_exceed_those_of_a_restart_the_standby_missed(
    pg_pair: Callable[..., Pair], opened: Opened
) -> None:
    """The standby's WAL receiver is stopped (a standby that lags); the primary crashes
    and comes back (a new start time: its first grant moves the tokens to the next
    range), grants, and dies; the standby, resumed, is promoted and grants."""
    pair = pg_pair(sync=False)
    url = url_of(pair)
    tokens: list[int] = []

    def grant() -> None:
        with opened(url).session("s", ttl=TTL) as session:
            lock = session.lock("t")
            tokens.append(lock.token)
            lock.release()

    grant()
    pair.wait_replayed()
    receiver = pair.standby.child("walreceiver")
    os.kill(receiver, signal.SIGSTOP)
    try:
        pair.primary.kill()
        pair.primary.start()
        grant()
        pair.primary.kill()
    finally:
        os.kill(receiver, signal.SIGCONT)
    pair.promote()
    grant()
    assert tokens[1] >= RANGE  # the restarted primary moved on
    assert tokens[2] > tokens[1], tokens


# -- fences -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", mode_params(*MODES))
def test_fenced_writes_stay_safe_through_a_failover(
    pg_pair: Callable[..., Pair], opened: Opened, mode: str
) -> None:
    """A holder writes through a fence, then (the standby no longer hearing) writes
    again; the primary dies. The next holder's token is above the old one, so once it
    has used the fence the old holder's late writes are turned away — by token, and,
    given the lock, at once. The fence keeps the new holder's value."""
    sync, durability = MODES[mode]
    pair = pg_pair(sync=sync)
    store = opened(url_of(pair), durability)
    holder = store.session("holder", ttl=TTL)
    held = holder.lock("register")
    fence = store.fence("register")
    fence.write(held, "1")
    pair.hold_back()
    try:
        fence.write(held.token, "2")  # lost (asynchronous), or never confirmed
    except StoreError:
        assert sync
    failover(pair)
    other = opened(url_of(pair))
    after = other.fence("register")
    with other.session("next", ttl=TTL) as session:
        taken = session.lock("register", timeout=3 * TTL) if durability == "relaxed" else None
        if taken is None:
            holder.close()  # let the lock go (the default durability keeps the session)
            taken = session.lock("register", timeout=3 * TTL)
        assert taken.token > held.token
        value = after.read(taken)
        assert value in ("1", "2")
        after.write(taken, "3")
        with pytest.raises(LockLost):
            fence.write(held.token, "late")
        with pytest.raises((LockLost, NotHeld)):  # lost, or released with its session
            fence.write(held, "late")
        assert after.read(taken) == "3"
        taken.release()


# -- a crash without a new postmaster ------------------------------------------------


@pytest.mark.xfail(strict=True, reason=CRASH_UNSEEN)
def test_relaxed_sessions_notice_a_crash_recovered_without_a_new_postmaster(
    pg_failover_template: Any, opened: Opened
) -> None:
    """One server, whose WAL writer is slow (``wal_writer_delay = 10s``: the default 200 ms
    leaves the same window, shorter). A relaxed grant commits without waiting for the
    WAL; a server process is killed (as the OOM killer does), and PostgreSQL
    reinitializes and recovers. The promise: the holder is told, and the tokens do not
    repeat."""
    server = Server(pg_failover_template.copy("solo"), "solo")
    server.conf("wal_writer_delay = 10s\n")
    server.start()
    try:
        url = (
            f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
            f"?connect_timeout=2&schema={SCHEMA}"
        )
        store = opened(url, "relaxed")
        told = Told()
        holder = store.session("holder", ttl=TTL, on_lost=told)
        victim = server.admin()
        held = holder.lock("job")
        os.kill(victim.info.backend_pid, signal.SIGKILL)
        wait_for(lambda: "reinitializing" in server.log.read_text(), what="the crash")
        crashed = time.monotonic()
        with opened(url).session("taker", ttl=TTL) as taker:
            taken = taker.lock("job", timeout=TTL)
            wait_for(lambda: confirmed_since(holder, crashed), timeout=TTL, what="a heartbeat")
            time.sleep(0.1)  # on_lost runs in a thread of its own
            told_in_time, tokens = bool(told.at), (held.token, taken.token)
            taken.release()
        # Found: the holder is not told, and the taker is given the holder's very token.
        assert told_in_time and tokens[1] > tokens[0], (told_in_time, tokens)
    finally:
        for store in opened.stores:
            store.close()
        opened.stores.clear()
        server.stop()


# -- the URL ---------------------------------------------------------------------------


def test_a_silent_old_primary_first_in_the_url_leaves_the_new_one_its_share(
    pg_pair: Callable[..., Pair],
) -> None:
    """libpq tries the hosts of a URL in turn and waits ``connect_timeout`` for each; a
    primary cut off by a partition neither answers nor refuses. Without a
    ``connect_timeout`` in the URL the store gives each host its share of the call's
    time (4 s over two hosts: 2 s each), so after the failover a store still opens on
    the new primary within the call timeout (it used to spend the whole call timeout on
    the old primary and fail); the URL's own ``connect_timeout=2`` costs the same."""
    pair = pg_pair(sync=False)
    plain = pair.url(SCHEMA, through_proxy=True)
    lockwarden.connect(plain, call_timeout=4.0).close()
    pair.fence_primary()
    pair.promote()
    spent: dict[str, float] = {}
    for label, url in (("plain", plain), ("connect_timeout=2", url_of(pair, through_proxy=True))):
        began = time.monotonic()
        store = lockwarden.connect(url, call_timeout=4.0)
        spent[label] = time.monotonic() - began
        store.close()
    assert 1.9 <= spent["plain"] < 4.0, spent  # the old primary's share, then the new one
    assert 1.9 <= spent["connect_timeout=2"] < 4.0, spent
