"""Writes that reach the etcd cluster late change nothing.

A request sent to a member that then stops answering (paused, cut off) is sent
again to another member; the first copy may still be applied when the member
comes back, after the client has moved on. Each test here applies such a copy
itself, at the worst moment (the etcd backend's design note, "Writes that arrive
late"): the copy must fail, and nothing may be held or queued for a request that has
ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from lockwarden import Deadlock, LockLost, StoreError
from lockwarden.store import Session, Store
from lockwarden.store.backends.etcd.backend import EtcdBackend
from lockwarden.store.backends.etcd.cluster import Op, Txn, dec, scan
from tests.conftest import Background, wait_for

Send = tuple[Sequence[Op], Sequence[Op], Sequence[Op]]


@pytest.fixture
def url(etcd_url: str) -> str:
    """These tests are etcd's alone: the shared `store` fixture opens this URL."""
    return etcd_url


def _backend(store: Store) -> EtcdBackend:
    backend = store._backend
    assert isinstance(backend, EtcdBackend)
    return backend


def _writes(success: Sequence[Op], kind: str, backend: EtcdBackend, *, puts: bool) -> bool:
    """Whether a transaction puts (or, unless ``puts``, deletes) a key of ``kind`` ("h"
    holder, "w" waiter, "f" fence, "p" permits)."""
    start = f"{backend.url.schema}/{kind}/"
    changes = ("request_put",) if puts else ("request_put", "request_delete_range")
    return any(
        dec(op[change]["key"]).startswith(start)
        for op in success
        for change in changes
        if change in op
    )


def _intercept(
    backend: EtcdBackend,
    kind: str,
    send: Callable[[Callable[..., Txn], Send], Txn],
    *,
    puts: bool = False,
) -> list[Send]:
    """Record the next transaction that puts (or, unless ``puts``, deletes) a key of
    ``kind``, sent through ``send``; the list returned gets its arguments, for a test to
    apply again later."""
    real = backend._kv.txn
    sent: list[Send] = []

    def txn(success: Sequence[Op], compare: Sequence[Op] = (), failure: Sequence[Op] = ()) -> Txn:
        if sent or not _writes(success, kind, backend, puts=puts):
            return real(success, compare, failure)
        sent.append((success, compare, failure))
        return send(real, sent[0])

    backend._kv.txn = txn  # type: ignore[method-assign]
    return sent


def _warm_up(store: Store, a: Session, b: Session) -> None:
    """A first wait of ``b``'s store, granted and released: the first wait of a store
    looks again at once (`wakeups.Wakeups.add`), which would race a grant handed by a
    release with an attempt of the waiter's own."""
    held = a.lock("warm-up")
    waiting = Background(lambda: b.lock("warm-up", timeout=10))
    wait_for(lambda: bool(store.waiters("warm-up")), what="b queued")
    held.release()
    waiting.result().release()


def _answer_lost(real: Callable[..., Txn], args: Send) -> Txn:
    """Applied, but its answer lost: the client sent it again (only then can a copy be late)."""
    return dataclasses.replace(real(*args), resent=True)


def _late(backend: EtcdBackend, sent: Send) -> Txn:
    """The recorded transaction, as the member that held its first copy applies it now."""
    return backend._kv.txn(*sent)


@pytest.mark.parametrize("names", [("x",), ("n0", "n3")])
def test_a_grant_applied_again_after_its_release_changes_nothing(
    store: Store, names: tuple[str, ...]
) -> None:
    backend = _backend(store)
    sent = _intercept(backend, "h", _answer_lost)
    with store.session(app_id="a") as s:
        s.lock_many([(name, "write") for name in names]).release()
        assert not backend._writes_on_their_way(s.id)  # the release voided the copy
        assert not _late(backend, sent[0]).succeeded
        assert store.locks() == []


def test_a_grant_that_got_no_answer_at_all_is_void_once_the_request_gives_up(
    store: Store,
) -> None:
    """Every member was silent: the call fails, the request gives up and is cleaned up;
    then the grant arrives."""
    backend = _backend(store)

    def silent(real: Callable[..., Txn], args: Send) -> Txn:
        raise StoreError("no member answered (a test)")

    sent = _intercept(backend, "h", silent)
    with store.session(app_id="a") as s:
        with pytest.raises(StoreError):
            s.lock("x")
        wait_for(lambda: s.releasing == 0, what="the clean-up confirmed")
        assert not _late(backend, sent[0]).succeeded
        assert store.locks("x") == []


def test_writes_answered_at_once_leave_no_ends_key(store: Store) -> None:
    """Nothing can arrive late, so a release is only its deletions."""
    backend = _backend(store)
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        held = a.lock("x")
        waiting = Background(lambda: b.lock("x", timeout=10))
        wait_for(lambda: bool(store.waiters("x")), what="b queued")
        held.release()
        waiting.result().release()
        found = backend._kv.read([scan(f"{backend.url.schema}/e/")])
        assert found.kvs(0) == []


def test_a_try_lock_whose_grant_went_unanswered_leaves_nothing_when_it_lands(
    store: Store,
) -> None:
    """The first copy of the grant is held back; the name is taken meanwhile, so the resent
    copy fails its guard and the try-lock gives up; then the first copy arrives."""
    backend = _backend(store)
    other = store.session(app_id="other")
    taken = []

    def unanswered(real: Callable[..., Txn], args: Send) -> Txn:
        taken.append(other.lock("x"))  # while the first copy waits in a silent member
        return dataclasses.replace(real(*args), resent=True)

    sent = _intercept(backend, "h", unanswered)
    with store.session(app_id="a") as s:
        assert s.try_lock("x") is None
        taken[0].release()
        assert not _late(backend, sent[0]).succeeded
        assert store.locks("x") == []
        assert s.try_lock("x") is not None  # and the session can take it again
    other.close()


def test_a_queue_entry_applied_again_after_its_grant_is_not_left_queued(store: Store) -> None:
    backend = _backend(store)
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        held = a.lock("x")
        sent = _intercept(backend, "w", _answer_lost)
        waiting = Background(lambda: b.lock("x", timeout=10))
        wait_for(lambda: bool(store.waiters("x")), what="b queued")
        held.release()
        granted = waiting.result()
        assert not _late(backend, sent[0]).succeeded
        assert store.waiters("x") == []
        granted.release()


def test_a_release_s_grant_applied_again_after_the_grantee_released_changes_nothing(
    store: Store,
) -> None:
    """The release that grants the waiter is applied, its answer lost; the waiter holds and
    releases; then the copy arrives. Its guard (the waiter's key as read) fails: the
    copy neither grants again nor deletes anything that is not the first release's."""
    backend = _backend(store)
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        _warm_up(store, a, b)
        handed = store.stats["handed"]
        held = a.lock("x")
        waiting = Background(lambda: b.lock("x", timeout=10))
        wait_for(lambda: bool(store.waiters("x")), what="b queued")
        sent = _intercept(backend, "h", _answer_lost, puts=True)  # the grant: not the release's
        # conditional transaction before it, which only deletes
        held.release()  # applied, its answer lost: the client would have sent it again
        granted = waiting.result()
        assert store.stats["handed"] == handed + 1
        granted.release()
        late = _late(backend, sent[0])
        assert not late.succeeded
        assert store.locks("x") == [] and store.waiters("x") == []
        assert b.lock("x", timeout=5).token > granted.token


def test_a_queue_entry_applied_again_after_a_deadlock_refusal_is_not_left_queued(
    store: Store,
) -> None:
    backend = _backend(store)
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        a.lock("p")
        held = b.lock("q")
        first = Background(lambda: a.lock("q", timeout=10))  # a waits for b
        wait_for(lambda: bool(store.waiters("q")), what="a queued")
        sent = _intercept(backend, "w", _answer_lost)
        with pytest.raises(Deadlock):
            b.lock("p", timeout=10)  # b would wait for a: refused
        assert not _late(backend, sent[0]).succeeded
        assert store.waiters("p") == []
        held.release()
        first.result().release()


def test_a_fence_reset_applied_again_after_new_writes_forgets_nothing(store: Store) -> None:
    """Forgetting the tokens written after the reset would let an older holder write."""
    backend = _backend(store)
    fence = store.fence("resource")
    fence.write(7, "before")
    sent = _intercept(backend, "f", _answer_lost)
    assert store.reset_fence("resource") == 7
    fence.write(3, "after")  # a holder after the reset
    assert not _late(backend, sent[0]).succeeded
    assert fence.state() == (3, "after")
    with pytest.raises(LockLost):
        fence.write(2, "older")


def test_a_permits_change_applied_again_after_a_later_one_changes_nothing(store: Store) -> None:
    backend = _backend(store)
    sent = _intercept(backend, "p", _answer_lost)
    store.set_permits("x", read=5, write=3, force=True)
    store.set_permits("x", read=2, write=1, force=True)
    assert not _late(backend, sent[0]).succeeded
    assert store.permits("x") == (2, 1)


def test_a_fence_write_whose_answer_was_lost_is_reported_unknown_not_refused(
    store: Store, connect: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write is applied, its answer lost (a partition), and a newer holder writes
    before the resent copy arrives: that copy fails its compare, which is no refusal (the
    first copy was applied), so the outcome is unknown (`StoreError`), not `LockLost`."""
    from etcd3gw import exceptions  # noqa: PLC0415

    from lockwarden.store.backends.etcd import cluster  # noqa: PLC0415

    fence, newer = store.fence("r"), connect().fence("r")
    fence.write(1, "one")
    real = cluster._Member.post
    lost: list[str] = []

    def post(member: cluster._Member, url: str, **kwargs: object) -> object:
        answer = real(member, url, **kwargs)
        if url.endswith("/kv/txn") and not lost and "request_put" in str(kwargs.get("json")):
            lost.append(url)
            newer.read(3)  # a newer holder comes by before the copy is sent again
            raise exceptions.ConnectionTimeoutError("the answer was lost")
        return answer

    monkeypatch.setattr(cluster._Member, "post", post)
    with pytest.raises(StoreError, match="outcome of a fence access is unknown"):
        fence.write(2, "two")
    monkeypatch.undo()
    assert lost and fence.state() == (3, "two")  # the first copy was applied
