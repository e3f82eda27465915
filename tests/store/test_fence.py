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
    fence.write(8, "v8")
    with pytest.raises(LockLost, match="has taken a write with token 8, newer than 7"):
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


def test_readers_sharing_a_lock_are_all_admitted_in_any_order(store: Store) -> None:
    """Read locks are shared: a reader with an older token is not turned away by a newer reader.

    Found by the chaos harness: before, the newer reader's read was "a newer
    token seen", and the older one got LockLost while it still held its lock.
    """
    fence = store.fence("shared")
    fence.write(0, "v0")
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        older, newer = a.lock("shared-lock", "read"), b.lock("shared-lock", "read")
        assert newer.token > older.token
        assert fence.read(newer.token) == "v0"
        assert fence.read(older.token) == "v0"  # was: LockLost
        older.check()
        fence.admit(older.token)


def test_a_write_still_turns_away_every_older_token(store: Store) -> None:
    fence = store.fence("written")
    fence.admit(9)  # a reader with token 9: older writers are fenced off...
    with pytest.raises(LockLost):
        fence.write(8, "stale")
    fence.read(8)  # ...but an older reader may still read what nobody has overwritten
    fence.write(10, "v10")
    for old in (8, 9):
        with pytest.raises(LockLost, match="newer than"):
            fence.read(old)  # the value was overwritten by a newer holder
        with pytest.raises(LockLost):
            fence.admit(old)
    assert fence.state() == (10, "v10")
