"""Bad input: a typed error saying what to do, raised before anything is stored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lockwarden import LockUsageError, NotHeld
from lockwarden.store import Session, Store

LONG = "é" * 256 + "x"  # 513 bytes of UTF-8, 257 characters


def _state(store: Store) -> tuple[object, ...]:
    return (
        [(e.name, e.mode, e.token, e.holder.session_id) for e in store.locks()],
        [(w.name, w.session_id) for w in store.waiters()],
        store.permits("held"),
    )


BAD_CALLS: list[tuple[str, Callable[[Store, Session], Any], str]] = [
    ("empty name", lambda st, s: s.lock(""), "must not be empty"),
    ("513-byte name", lambda st, s: s.lock(LONG), "513 bytes"),
    ("name not text", lambda st, s: s.lock(b"x"), "must be a string"),
    ("NUL in name", lambda st, s: s.lock("a\x00b"), "NUL"),
    ("unknown mode", lambda st, s: s.lock("held", mode="rw"), "unknown lock mode"),
    ("intention mode", lambda st, s: s.lock("held", mode="IX"), "'read' and 'write'"),
    ("negative timeout", lambda st, s: s.lock("held", timeout=-1), "timeout must be"),
    ("NaN timeout", lambda st, s: s.lock("held", timeout=float("nan")), "timeout must be"),
    ("infinite timeout", lambda st, s: s.lock("held", timeout=float("inf")), "use None"),
    ("timeout not a number", lambda st, s: s.lock("held", timeout="5"), "timeout must be"),
    ("bad stale policy", lambda st, s: s.lock("held", on_stale="steal"), "on_stale"),
    ("empty multi-lock", lambda st, s: s.lock_many([]), "at least one"),
    ("name twice", lambda st, s: s.lock_many([("a", "read"), ("a", "write")]), "twice"),
    ("not pairs", lambda st, s: s.lock_many(["ab"]), "pair"),
    ("multi-lock bad name", lambda st, s: s.try_lock_many([("ok", "read"), ("", "read")]), "empty"),
    ("read permits 0", lambda st, s: st.set_permits("held", read=0), "permits must be"),
    ("write permits 0", lambda st, s: st.set_permits("held", write=0), "permits must be"),
    ("write permits None", lambda st, s: st.set_permits("held", write=None), "permits must be"),
    ("permits a bool", lambda st, s: st.set_permits("held", read=True), "permits must be"),
    # Found by the fuzz: past BIGINT, SQLite raised OverflowError and PostgreSQL a StoreError.
    ("read permits 2**63", lambda st, s: st.set_permits("held", read=2**63), "2\\*\\*63 - 1"),
    ("write permits 2**70", lambda st, s: st.set_permits("held", write=2**70), "2\\*\\*63 - 1"),
    ("ttl 0", lambda st, s: st.session(app_id="x", ttl=0), "ttl must be"),
    ("ttl NaN", lambda st, s: st.session(app_id="x", ttl=float("nan")), "ttl must be"),
    ("empty app id", lambda st, s: st.session(app_id=""), "app_id"),
    ("empty name to break", lambda st, s: st.break_lock(""), "must not be empty"),
    ("fence token negative", lambda st, s: st.fence("f").write(-1, "v"), "token"),
    ("fence token 2**63", lambda st, s: st.fence("f").read(2**63), "2\\*\\*63 - 1"),
    ("fence value not text", lambda st, s: st.fence("f").write(1, b"v"), "text"),
    ("fence resource empty", lambda st, s: st.fence(""), "must not be empty"),
]


@pytest.mark.parametrize(
    ("call", "message"), [(c, m) for _, c, m in BAD_CALLS], ids=[i for i, _, _ in BAD_CALLS]
)
def test_bad_input_is_refused_and_nothing_changes(
    store: Store, call: Callable[[Store, Session], Any], message: str
) -> None:
    with store.session(app_id="a") as s, store.session(app_id="b") as other:
        s.lock("held")
        other.try_lock("held")  # busy: stays as it is
        store.set_permits("held", read=3)
        before = _state(store)
        with pytest.raises(LockUsageError, match=message):
            call(store, s)
        assert _state(store) == before


def test_a_stamp_of_another_session_is_refused(store: Store) -> None:
    with store.session(app_id="a") as a, store.session(app_id="b") as b:
        stamp = a.lock_many([("s1", "read"), ("s2", "write")])
        before = _state(store)
        with pytest.raises(NotHeld, match="another session"):
            b.release(stamp)
        with pytest.raises(NotHeld, match="expected a Stamp"):
            b.release("not a stamp")  # type: ignore[arg-type]
        assert _state(store) == before
