"""A fuzz of the store's public API with bad (and good) input, on both backends.

Every call either succeeds or fails with a typed error — a `LockError`; bad
input is a `LockUsageError`, which is also a `ValueError` — whose message is
not empty, and a failure leaves the stored
state exactly as it was: locks, waiters, permits, fences, sessions. A call
that succeeds is undone (release, close, permits put back), which must also
leave nothing behind. ``LOCKWARDEN_FUZZ_EXAMPLES`` sets the examples per test
(CI: a few hundred); ``--hypothesis-show-statistics`` prints what was tried,
call by call and outcome by outcome.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import lockwarden
from lockwarden import LockError, Mode
from lockwarden.store import HeldLock, Session, Store
from lockwarden.store.backends.postgresql import connections as pgconn
from tests.conftest import PG, pg_admin

EXAMPLES = int(os.environ.get("LOCKWARDEN_FUZZ_EXAMPLES", "500"))

BUSY = ("busy-write", "busy-read", "other-held")
"""Names held by other sessions of the fixture (a write, a read, a read)."""

FIXTURE_APPS = ("fuzz-holder", "fuzz-other", "fuzz-me")

# -- inputs -------------------------------------------------------------------------

junk = st.one_of(
    st.booleans(),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
    st.builds(object),
    st.just(Mode.IX),
)
"""Values of the wrong type altogether (numbers and text are drawn separately)."""

numbers = st.one_of(
    st.integers(-3, 3),
    st.integers(2**62, 2**70),  # beyond BIGINT
    st.sampled_from([2**1100, 10**400, -(2**1100), 10**5000]),  # beyond float, or repr's limit
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e-320, 1e308]),
)

names = st.one_of(
    st.text(min_size=1, max_size=12),
    st.sampled_from(BUSY),
    st.just(""),
    st.text(max_size=3).map(lambda s: s + "\x00"),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2),  # lone surrogates
    st.integers(505, 520).map(lambda n: "x" * n),  # around the 512-byte limit
    st.integers(250, 260).map(lambda n: "é" * n),  # the same in two-byte characters
    numbers,
    junk,
    st.none(),
)

modes = st.one_of(
    st.sampled_from(["read", "write", " Write ", "shared", "exclusive", "S", "X", "IS", "SIX", ""]),
    st.sampled_from(list(Mode)),
    st.text(max_size=4),
    numbers,
    junk,
    st.none(),
)

timeouts = st.one_of(
    st.floats(max_value=0.05),  # never long: a valid timeout on a busy name is waited out
    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1]),
    st.text(max_size=3),
    junk,
)
"""No None and no long waits: those are valid, and would only make the test wait
(`lock_free` tries long timeouts where nothing is in the way)."""

permits = st.one_of(st.none(), numbers, st.text(max_size=2), junk)
tokens = st.one_of(st.integers(-2, 2**40), numbers, st.text(max_size=2), junk, st.none())
durations = st.one_of(numbers, st.text(max_size=2), junk, st.none())
policies = st.one_of(st.sampled_from(["reclaim", "refuse", "REFUSE", ""]), junk, st.none())
items = st.one_of(
    st.lists(st.tuples(names, modes), max_size=3),
    st.lists(st.sampled_from(["read", "write"]).map(lambda m: ("multi", m)), max_size=3),
    st.lists(st.lists(st.text(max_size=2), max_size=3), max_size=2),
    st.text(max_size=3),
    junk,
    st.none(),
)


# -- the store under test -----------------------------------------------------------


@dataclass
class World:
    store: Store
    url: str
    me: Session
    stamps: list[HeldLock]
    """A lock of another session, one held by the holder, and one of ours already released."""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    schema = f"lw_test_{secrets.token_hex(4)}"
    url = (
        f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'locks.db'}"
        if request.param == "sqlite"
        else f"{PG}?schema={schema}"
    )
    store = lockwarden.connect(url)
    holder = store.session(app_id="fuzz-holder", ttl=60)
    other = store.session(app_id="fuzz-other", ttl=60)
    me = store.session(app_id="fuzz-me", ttl=60)
    held = holder.lock("busy-write")
    holder.lock("busy-read", "read")
    theirs = other.lock("other-held", "read")
    released = me.lock("released-once")
    released.release()
    store.set_permits("capped", read=2, write=1)
    store.fence("fenced").write(100, "v")
    yield World(store, url, me, [theirs, held, released])
    store.close()
    if request.param == "postgres":
        with pg_admin() as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def snapshot(store: Store, *, records: bool = True) -> tuple[list[tuple[Any, ...]], ...]:
    """Everything stored, but heartbeat times and ages (they move on their own); with
    ``records``, the administrators' records too (which an undo does not take back)."""

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return sorted(tuple(row.values()) for row in store._backend.query(sql))

    return (
        sorted((e.name, e.mode, e.token, e.holder.session_id) for e in store.locks()),
        sorted((w.name, w.mode, w.session_id, w.stale) for w in store.waiters()),
        rows("SELECT name, read_permits, write_permits FROM {p}lw_permits"),
        rows("SELECT resource, token, written, value FROM {p}lw_fences"),
        rows("SELECT id, app_id, expired FROM {p}lw_sessions"),
        rows("SELECT id FROM {p}lw_admin") if records else [],
    )


Undo = Callable[[], object] | None
"""What puts a successful call's change back; None: the change is meant to stay (fences)."""


def _nothing() -> None:
    return None


def lock(w: World, data: st.DataObject) -> Undo:
    stale = data.draw(policies)
    return w.me.lock(data.draw(names), data.draw(modes), data.draw(timeouts), stale).release


def lock_free(w: World, data: st.DataObject) -> Undo:
    """Any number as a timeout (2**70, 1e308, ...), on a name nobody holds."""
    name = f"free-{secrets.token_hex(4)}"
    return w.me.lock(name, data.draw(modes), data.draw(st.one_of(st.none(), numbers))).release


def try_lock(w: World, data: st.DataObject) -> Undo:
    held = w.me.try_lock(data.draw(names), data.draw(modes))
    return _nothing if held is None else held.release


def lock_many(w: World, data: st.DataObject) -> Undo:
    return w.me.lock_many(data.draw(items), data.draw(timeouts), data.draw(policies)).release


def try_lock_many(w: World, data: st.DataObject) -> Undo:
    stamp = w.me.try_lock_many(data.draw(items))
    return _nothing if stamp is None else stamp.release


def release(w: World, data: st.DataObject) -> Undo:
    w.me.release(data.draw(st.one_of(st.sampled_from(w.stamps), junk, names)))
    return _nothing


def shared_lock(w: World, data: st.DataObject) -> Undo:
    name = data.draw(names)
    handle = w.me.Lock(name, data.draw(modes))
    blocking = data.draw(st.one_of(st.booleans(), junk))
    # -1 is "no limit" here: valid, and on a busy name a wait for ever.
    limited = timeouts.filter(lambda t: t != -1)
    timeout = data.draw(limited if name in BUSY else st.one_of(st.just(-1), timeouts))
    return handle.release if handle.acquire(blocking, timeout) else _nothing


def set_permits(w: World, data: st.DataObject) -> Undo:
    """A raise on a busy name waits for its holders: never long here (or forced)."""
    name = data.draw(names)
    before = w.store.permits(name) if isinstance(name, str) else None
    force = data.draw(st.one_of(st.booleans(), junk))
    read = data.draw(st.one_of(st.sampled_from([None, 1, 2, 3]), permits))
    write = data.draw(st.one_of(st.sampled_from([1, 2, 3]), permits))
    wait = data.draw(st.one_of(st.sampled_from([0, 0.05]), timeouts))
    w.store.set_permits(name, read, write, force=force, timeout=wait)
    assert before is not None  # the name was checked before anything was stored
    return lambda: w.store.set_permits(name, before.read, before.write, force=True)


def read_status(w: World, data: st.DataObject) -> Undo:
    name = data.draw(st.one_of(st.none(), names))
    w.store.permits(name) if data.draw(st.booleans()) else w.store.locks(name)
    w.store.waiters(name)
    return _nothing


def session(w: World, data: st.DataObject) -> Undo:
    on_lost = data.draw(st.one_of(st.none(), st.just(print), junk))
    ttl = data.draw(st.one_of(durations, st.just(1e308)))
    return w.store.session(data.draw(names), ttl, on_lost).close


def admin(w: World, data: st.DataObject) -> Undo:
    """Breaking locks, releasing an application's, resetting fences: never the fixture's own."""
    kind = data.draw(st.sampled_from(["break", "release_all", "reset_fence", "log"]))
    if kind == "break":
        w.store.break_lock(data.draw(names.filter(lambda n: n not in BUSY)))
    elif kind == "release_all":
        app = data.draw(names.filter(lambda n: n not in FIXTURE_APPS))
        w.store.release_all(app, force=data.draw(st.one_of(st.booleans(), junk)))
    elif kind == "reset_fence":
        w.store.reset_fence(data.draw(names.filter(lambda n: n != "fenced")))
        return None  # a fence the fuzz wrote may be gone: meant to be
    else:
        w.store.admin_log(data.draw(st.one_of(st.integers(-1, 3), numbers, junk)))
    return _nothing


def fence(w: World, data: st.DataObject) -> Undo:
    resource = data.draw(st.one_of(st.just("fenced"), names))
    token = data.draw(st.one_of(tokens, st.sampled_from(w.stamps)))  # or a lock: ours or not
    f = w.store.fence(resource)
    kind = data.draw(st.sampled_from(["read", "write", "admit", "state"]))
    if kind == "write":
        value = st.one_of(st.text(max_size=4), st.none(), numbers, junk, names)
        f.write(token, data.draw(value))
    elif kind == "state":
        f.state()
    else:
        getattr(f, kind)(token)
    return None


def reconnect(w: World, data: st.DataObject) -> Undo:
    options = {
        "max_hold": data.draw(durations),
        "on_stale": data.draw(policies),
        "lock_delay": data.draw(durations),
        "durability": data.draw(st.one_of(st.sampled_from(["durable", "relaxed"]), junk)),
    }
    chosen = data.draw(st.sets(st.sampled_from(sorted(options))))
    return lockwarden.connect(w.url, **{k: v for k, v in options.items() if k in chosen}).close


CALLS = [
    lock,
    lock_free,
    try_lock,
    lock_many,
    try_lock_many,
    release,
    shared_lock,
    set_permits,
    read_status,
    session,
    admin,
    fence,
    reconnect,
]


def expect_typed(exc: BaseException, what: str) -> None:
    """A failure must be a LockError (bad input: LockUsageError, also a ValueError) with a message.

    Stricter than "a LockError or a ValueError": a bare ValueError or
    OverflowError from a driver was what the fuzz found, and was fixed.
    """
    assert isinstance(exc, LockError), f"{what} raised {exc!r}"
    assert str(exc).strip(), f"{what} raised {type(exc).__name__} without a message"
    event(f"{what}: {type(exc).__name__}")


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_bad_input_is_a_typed_error_and_changes_nothing(world: World, data: st.DataObject) -> None:
    call = data.draw(st.sampled_from(CALLS), label="call")
    before = snapshot(world.store)
    try:
        undo = call(world, data)
    except Exception as exc:
        expect_typed(exc, call.__name__)
        assert snapshot(world.store) == before, f"{call.__name__} failed but changed the store"
        return
    event(f"{call.__name__}: ok")
    if undo is not None:
        undo()
        after = snapshot(world.store, records=False)
        assert after == (*before[:-1], []), f"{call.__name__} left something behind"


urls = st.one_of(
    st.builds(
        "{}://{}{}{}".format,
        st.sampled_from(["sqlite", "SQLite", "postgresql", "postgres", "mysql", "", "http"]),
        st.sampled_from(["", "127.0.0.1:1", "u:pw@127.0.0.1:1", "[::1", "127.0.0.1:99999", "@"]),
        st.one_of(
            st.sampled_from(["", "/", "//", "/db", "/:memory:", "//no/such/dir/x.db", "/d/"]),
            st.text(max_size=8).map("/{}".format),
        ),
        st.sampled_from(
            [
                "",
                "?schema=ok",
                "?schema=Bad-Name",
                "?schema=",
                "?schema=a&schema=b",
                "?x=1",
                "?password=secret",
                "?schema=" + "a" * 60,
                "?connect_timeout=x",
            ]
        ),
    ),
    st.text(max_size=30),
    numbers,
    junk,
    st.none(),
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(url=urls)
def test_any_url_opens_a_store_or_is_a_typed_error(
    url: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL URLs only ever reach a closed port (127.0.0.1:1, also for the host
    libpq would take from the environment); SQLite files land in a scratch directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", "1")
    monkeypatch.setattr(pgconn, "RETRY_DELAYS", ())
    try:
        store = lockwarden.connect(url)  # type: ignore[arg-type]
    except Exception as exc:
        expect_typed(exc, "connect")
        assert "secret" not in str(exc), "a password in an error message"
        return
    event("connect: ok")
    store.close()
