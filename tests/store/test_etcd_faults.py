"""Cluster faults under the etcd store: a leader killed, a minority flapping, the quorum
lost, a member paused. Each test uses a private cluster of this module's own (members
are killed and restarted here), and leaves every member running."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockwarden
from chaos.etcd_cluster import EtcdCluster
from lockwarden import LockLost, LockTimeout, StoreError
from lockwarden.store import Store
from lockwarden.store.bounds import CALL_TIMEOUT
from tests.conftest import Background

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    members = EtcdCluster(Path(tmp_path_factory.mktemp("etcd-faults")))
    yield members
    members.stop()


@pytest.fixture
def store(cluster: EtcdCluster) -> Iterator[Store]:
    for i, proc in enumerate(cluster.procs):  # whatever an earlier test left down
        if proc is None:
            cluster.start(i)
    cluster.wait_healthy()
    opened = lockwarden.connect(cluster.url(f"lw_fault_{secrets.token_hex(4)}"))
    yield opened
    opened.close()


def test_leader_killed_while_a_lock_is_held_and_waiters_queue(
    cluster: EtcdCluster, store: Store
) -> None:
    holder = store.session(app_id="holder", ttl=5)
    held = holder.lock("job")
    waiters = [store.session(app_id=f"w{i}", ttl=5) for i in range(2)]
    got = [Background(lambda s=s: s.lock("job", timeout=30)) for s in waiters]
    time.sleep(0.5)
    cluster.kill(cluster.leader())
    time.sleep(1.0)  # a new leader is elected; the holder's lease survives the change
    held.check()
    assert [e.holder.session_id for e in store.locks("job")] == [holder.id]
    held.release()
    tokens = [held.token]
    for _ in waiters:  # each waiter in turn, never two at once, each token larger
        done = [g for g in got if not g.is_alive()]
        deadline = time.monotonic() + 20
        while not done and time.monotonic() < deadline:
            time.sleep(0.05)
            done = [g for g in got if not g.is_alive()]
        [winner] = done
        lock = winner.result()
        assert len(store.locks("job")) == 1
        assert lock.token > tokens[-1]
        tokens.append(lock.token)
        got.remove(winner)
        lock.release()
    for s in (holder, *waiters):
        s.close()


def test_a_flapping_minority_keeps_exclusion_and_fences(cluster: EtcdCluster, store: Store) -> None:
    """Workers (each with a store of its own) contend for one lock while one member at a
    time is killed and restarted; nobody is ever inside with another, and every write
    through the fence carries a token newer than the last."""
    url = store.url
    fence = store.fence("counter")
    inside = 0
    overlaps: list[int] = []
    refused: list[int] = []
    tokens: list[int] = []
    stop = threading.Event()
    guard = threading.Lock()

    def work(seed: int) -> None:
        nonlocal inside
        with lockwarden.connect(url) as mine, mine.session(app_id=f"w{seed}", ttl=5) as s:
            while not stop.is_set():
                try:
                    lock = s.lock("counter", timeout=2)
                except (LockTimeout, StoreError):
                    continue
                with guard:
                    inside += 1
                    overlaps.append(inside)
                try:
                    mine.fence("counter").write(lock.token, str(seed))
                    tokens.append(lock.token)
                except LockLost:
                    refused.append(lock.token)
                except StoreError:
                    pass
                with guard:
                    inside -= 1
                with contextlib.suppress(LockLost, StoreError):
                    lock.release()

    workers = [Background(lambda seed=seed: work(seed)) for seed in range(3)]
    for turn in range(4):
        member = turn % 3
        cluster.kill(member)
        time.sleep(1.0)
        cluster.start(member)
        time.sleep(1.0)
    stop.set()
    for worker in workers:
        worker.result(timeout=60)
    assert tokens, "no worker got the lock while a minority flapped"
    assert max(overlaps) == 1
    assert refused == []  # one holder at a time: the fence never saw an older token
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert fence.state()[0] == tokens[-1]


def test_quorum_lost_fails_typed_and_in_bounded_time_then_recovers(
    cluster: EtcdCluster, store: Store
) -> None:
    with store.session(app_id="a", ttl=30) as s:
        s.lock("before").release()
        survivors = cluster.leader()
        down = [i for i in range(3) if i != survivors]
        for i in down:
            cluster.kill(i)
        started = time.monotonic()
        with pytest.raises(StoreError, match="majority"):
            s.lock("during", timeout=1)
        assert time.monotonic() - started < 3 * CALL_TIMEOUT
        with pytest.raises(StoreError):
            store.locks()
        for i in down:
            cluster.start(i)
        cluster.wait_healthy()
        with s.lock("after", timeout=10) as lock:  # the same store and session go on
            assert lock.token > 0


def test_a_paused_member_costs_time_not_correctness(cluster: EtcdCluster, store: Store) -> None:
    paused = cluster.leader()
    with store.session(app_id="a", ttl=10) as a, store.session(app_id="b", ttl=10) as b:
        first = a.lock("p")
        cluster.pause(paused)
        try:
            assert b.try_lock("p") is None  # the others elect a leader and answer
            first.release()
            second = b.lock("p", timeout=15)
            assert second.token > first.token
            assert [e.holder.session_id for e in store.locks("p")] == [b.id]
        finally:
            cluster.resume(paused)
        second.release()


@pytest.mark.parametrize("which", ["leader", "follower"])
def test_a_short_lease_outlives_a_paused_member(
    cluster: EtcdCluster, store: Store, which: str
) -> None:
    """A heartbeat's bound is short (half its interval: 0.33 s with a 2 s TTL), shorter
    than a member's request timeout: it must not spend it all on the one member that is
    paused, or every session whose calls went there is lost."""
    leader = cluster.leader()
    paused = leader if which == "leader" else (leader + 1) % cluster.size
    with store.session(app_id="short", ttl=2.0) as session:
        held = session.lock("p")
        # Its calls go to the paused member first: the one that answered last.
        store._backend._kv._first = paused
        cluster.pause(paused)
        try:
            time.sleep(4.0)  # two TTLs: every heartbeat meets the paused member first
            assert not session.lost
            held.check()
        finally:
            cluster.resume(paused)
        held.release()


def test_a_lease_renewal_answered_in_an_old_term_does_not_count(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """etcd renews leases in its leader's memory: a leader paused or cut off, not yet told
    of the term the others moved on to, renews and says so while the real leader lets the
    lease expire. A renewal answered in a term the cluster is no longer in is no renewal."""
    from lockwarden.store.backends.etcd import cluster  # noqa: PLC0415

    with store.session(app_id="renewing", ttl=30) as session:
        real = cluster._Member.post

        def post(member: cluster._Member, url: str, **kwargs: object) -> object:
            answer = real(member, url, **kwargs)
            if url.endswith("/lease/keepalive"):
                header = answer["result"]["header"]  # type: ignore[index]
                header["raft_term"] = str(int(header["raft_term"]) - 1)  # a stale leader's
            return answer

        before = session.expires_at
        monkeypatch.setattr(cluster._Member, "post", post)
        with pytest.raises(StoreError, match="may no longer have been the leader"):
            session.renew()
        assert abs(session.expires_at - before) < 0.01 and not session.lost  # not moved
        monkeypatch.undo()
        assert session.renew() > before  # an answer in the cluster's term counts
