"""Closing a session on etcd while one of its requests is being granted leaves nothing."""

from __future__ import annotations

import secrets

import pytest

from lockwarden.store import Store
from lockwarden.store.backends.base import AcquireRequest
from lockwarden.store.backends.etcd.backend import EtcdBackend


@pytest.fixture
def url(etcd_url: str) -> str:
    """These tests are etcd's alone: the shared `store` fixture opens this URL."""
    return etcd_url


def test_a_grant_racing_the_close_of_its_session_is_not_left_behind(store: Store) -> None:
    """The grant lands right after the close has read the session's holder keys (as a
    thread still waiting would, woken at that moment): it must fail, or be deleted."""
    backend = store._backend
    assert isinstance(backend, EtcdBackend)
    session = store.session(app_id="closing")
    read_holders = backend._session_holders
    outcomes: list[str] = []

    def holders_then_a_grant(session_id: str) -> list[tuple[str, str]]:
        found = read_holders(session_id)
        request = AcquireRequest(
            session_id, secrets.token_hex(16), ("late",), ("X",), True, False, None
        )
        outcomes.append(backend.acquire(request).status)
        return found

    backend._session_holders = holders_then_a_grant  # type: ignore[method-assign]
    session.close()
    assert outcomes == ["lost"]  # the session key was already gone
    assert store.locks() == []
