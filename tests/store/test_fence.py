"""Fences: the highest token wins, an older one is turned away (D7)."""

from __future__ import annotations

import pytest

from lockwarden import LockLost
from lockwarden.store import Store

from .conftest import stop_heartbeat


def test_a_fence_rejects_an_older_token(store: Store) -> None:
    fence = store.fence("orders-table")
    assert fence.state() == (0, None)
    fence.write(5, "v5")
    fence.write(5, "v5b")  # the same holder may write again
    fence.admit(7)
    with pytest.raises(LockLost, match="already admitted token 7") as caught:
        fence.write(6, "late")
    assert (caught.value.name, caught.value.token) == ("orders-table", 6)
    assert fence.state() == (7, "v5b")  # the refused write changed nothing
    assert fence.read(8) == "v5b"
    with pytest.raises(LockLost):
        fence.read(7)


def test_a_reclaimed_holder_cannot_write_through_the_fence(store: Store) -> None:
    """A fenced read-modify-write of a register, with a holder that lost its lock unaware."""
    fence = store.fence("register")
    paused = store.session(app_id="paused", ttl=0.3)
    old = paused.lock("register-lock")
    value = int(fence.read(old.token) or "0")
    stop_heartbeat(paused)  # it freezes between its read and its write
    with store.session(app_id="next") as s:
        new = s.lock("register-lock", timeout=5)
        assert new.token > old.token
        fence.write(new.token, str(int(fence.read(new.token) or "0") + 1))
        with pytest.raises(LockLost):
            fence.write(old.token, str(value + 1))  # the thawed holder's write
        assert fence.state() == (new.token, "1")


def test_tokens_grow_across_grants_reclaims_and_breaks(store: Store) -> None:
    tokens = []
    with store.session(app_id="a") as a:
        tokens.append(a.lock("t").token)
        tokens.append(a.lock("other").token)
        store.break_lock("t")
        tokens.append(a.lock("t").token)
    dead = store.session(app_id="dead", ttl=0.3)
    tokens.append(dead.lock("t", timeout=1).token)
    stop_heartbeat(dead)
    with store.session(app_id="b") as b:
        tokens.append(b.lock("t", timeout=5).token)  # a reclaim
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
