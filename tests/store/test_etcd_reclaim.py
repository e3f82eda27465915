"""The reclaim count on etcd: one key, moved by the reclaim's own transaction, under a guard
on its revision, so that neither a concurrent reclaim nor a resent transaction miscounts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import pytest

import lockwarden
from lockwarden.store import Session, Store
from lockwarden.store.backends.base import AcquireRequest
from lockwarden.store.backends.etcd.backend import EtcdBackend
from lockwarden.store.backends.etcd.cluster import Op, Txn, enc
from tests.conftest import stop_heartbeat, wait_for


@pytest.fixture
def stores(etcd_url: str) -> Iterator[list[Store]]:
    opened = [lockwarden.connect(etcd_url) for _ in range(2)]
    yield opened
    for store in opened:
        store.close()


def _dead_holder(store: Store, *names: str) -> Session:
    """A session holding ``names`` that has gone silent, once its locks are seen stale."""
    dead = store.session(app_id="dead", ttl=0.3)
    for name in names:
        dead.lock(name)
    stop_heartbeat(dead)
    wait_for(lambda: all(e.stale for e in store.locks()), what="the dead locks stale")
    return dead


def _around_reclaim(store: Store, before: Callable[[], object], send: Callable[..., Txn]) -> None:
    """Make the store's first reclaim transaction run ``before`` first, then go by ``send``."""
    backend = store._backend
    assert isinstance(backend, EtcdBackend)
    real = backend._kv.txn
    count = enc(backend.url.schema + "/r")
    done: list[bool] = []

    def txn(success: Sequence[Op], compare: Sequence[Op] = ()) -> Txn:
        counts = any(op.get("request_put", {}).get("key") == count for op in success)
        if not counts or done:
            return real(success, compare)
        done.append(True)
        before()
        return send(real, success, compare)

    backend._kv.txn = txn  # type: ignore[method-assign]


def test_a_reclaim_beaten_to_the_count_reads_it_again(stores: list[Store]) -> None:
    a, b = stores
    _dead_holder(a, "x", "y")
    taker = b.session(app_id="b")
    # b reclaims "y" between a's read of the count and a's write of it
    _around_reclaim(a, lambda: taker.lock("y", timeout=5), lambda real, *args: real(*args))
    with a.session(app_id="a") as s:
        s.lock("x", timeout=5)
    assert a.reclaimed_count() == b.reclaimed_count() == 2
    taker.close()


def test_a_reclaim_resent_after_its_answer_was_lost_counts_once(stores: list[Store]) -> None:
    a, _ = stores
    _dead_holder(a, "x")

    def lost_answer(real: Callable[..., Txn], *args: Sequence[Op]) -> Txn:
        real(*args)  # applied; its answer never came back, so it is sent again
        return dataclasses.replace(real(*args), resent=True)

    _around_reclaim(a, lambda: None, lost_answer)
    with a.session(app_id="a") as s:
        request = AcquireRequest(s.id, "resent", ("x",), ("X",), True, False, 5)
        found = a._backend.acquire(request)
        assert (found.status, found.reclaimed) == ("granted", True)
    assert a.reclaimed_count() == 1
