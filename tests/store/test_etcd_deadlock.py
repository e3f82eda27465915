"""On etcd the enqueue and the deadlock check are two steps: the request that closed a
cycle is refused even when an older waiter of the cycle looks in between."""

from __future__ import annotations

import secrets

import pytest

from lockwarden.store import Session, Store
from lockwarden.store.backends.base import AcquireRequest, Attempt
from lockwarden.store.backends.etcd.backend import EtcdBackend


@pytest.fixture
def url(etcd_url: str) -> str:
    """These tests are etcd's alone: the shared `store` fixture opens this URL."""
    return etcd_url


def attempt(session: Session, request: str, name: str) -> Attempt:
    backend = session._store._backend
    return backend.acquire(AcquireRequest(session.id, request, (name,), ("X",), True, False, 30))


def test_an_older_waiter_looking_before_the_closer_checks_leaves_the_cycle_to_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = store._backend
    assert isinstance(backend, EtcdBackend)
    a, b = store.session(app_id="a"), store.session(app_id="b")
    a.lock("L1")
    b.lock("L2")
    older, closer = secrets.token_hex(16), secrets.token_hex(16)
    assert attempt(a, older, "L2").status == "blocked"  # no cycle yet
    with monkeypatch.context() as m:  # the closer has queued but not yet checked
        m.setattr(backend, "_deadlock", lambda request, session: None)
        assert attempt(b, closer, "L1").status == "blocked"
    assert attempt(a, older, "L2").status == "blocked"  # not the older waiter's to break
    refused = attempt(b, closer, "L1")
    assert refused.status == "deadlock"
    assert {(src, dst) for src, dst in refused.edges} == {(a.id, b.id), (b.id, a.id)}
    assert [w.session_id for w in store.waiters()] == [a.id]  # the older waiter waits on
    a.close()
    b.close()
