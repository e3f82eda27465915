"""The store's public objects: Store, Session, Stamp, HeldLock, SharedLock.

A `Store` is one database; a `Session` is one participant in it, kept alive
by the store's heartbeat thread (one statement per session per interval,
however many locks it holds). A session takes locks; what it gets back is a
`Stamp` (a set of locks granted together, D6) or its one-lock form, a
`HeldLock`. See the design note (README.md in this package) for the
algorithm and why it is safe.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from lockwarden.errors import LockLost, LockTimeout, LockUsageError, NotHeld
from lockwarden.modes import Mode
from lockwarden.store import queries, validate
from lockwarden.store.aio import AsyncAcquire, run_async
from lockwarden.store.backend import Backend, Stats
from lockwarden.store.fence import Fence
from lockwarden.store.heartbeat import Heartbeat
from lockwarden.store.postgres import PostgresBackend
from lockwarden.store.sqlite import SQLiteBackend
from lockwarden.store.status import Cleaned, LockEntry, Permits, WaiterEntry, holder_of
from lockwarden.store.url import parse_url
from lockwarden.store.waiting import Steps, Want, acquire_steps, describe, run_sync
from lockwarden.store.wakeups import AsyncSubscription, Subscription

log = logging.getLogger("lockwarden.store")

S = TypeVar("S", bound="Stamp")

LEASE_MARGIN = 0.1
"""The local lease ends this fraction of the TTL early (design note, "Heartbeat and lost locks")."""


class Store:
    """A lock store in one database. Make one with `lockwarden.connect`."""

    def __init__(
        self, backend: Backend, *, max_hold: float | None, on_stale: str, lock_delay: float
    ) -> None:
        self._backend = backend
        self.max_hold = max_hold
        """Waiters give up with `HeldTooLong` behind a lock held longer than this (D10)."""
        self.on_stale = on_stale
        """The default stale policy of `Session.lock`: "reclaim" or "refuse" (D8)."""
        self.lock_delay = lock_delay
        """Seconds a lock taken over from a dead holder is withheld from its new holder (D8)."""
        self._heartbeat = Heartbeat()
        self._sessions: set[Session] = set()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def url(self) -> str:
        """The store's URL, without any password."""
        return self._backend.url.display

    @property
    def stats(self) -> Stats:
        """Statements sent and attempts made so far (each statement is one round trip)."""
        return self._backend.stats

    def session(
        self,
        app_id: str,
        ttl: float = 15.0,
        on_lost: Callable[[LockLost], None] | None = None,
    ) -> Session:
        """Open a session: the unit of liveness for every lock it takes (D2).

        ``ttl`` is how long the session survives without a heartbeat (beats
        come every ttl/3). ``on_lost`` is called once, with a `LockLost`, if
        the session loses its locks (from the heartbeat thread, or from
        `Session.close` if that comes first).
        """
        app_id = validate.name(app_id, "app_id")
        ttl_s = validate.duration(ttl, "ttl", zero=False)
        if on_lost is not None and not callable(on_lost):
            raise LockUsageError(f"on_lost must be callable, got {on_lost!r}")
        with self._lock:
            if self._closed:
                raise LockUsageError("this store is closed")
        session = Session(self, app_id, ttl_s, on_lost)
        with self._lock:
            self._sessions.add(session)
        self._heartbeat.add(session)
        return session

    def set_permits(self, name: str, read: int | None = None, write: int = 1) -> None:
        """Cap how many may hold ``name`` at once in each mode (D4); None: readers unlimited.

        Seen by the very next attempt of every client; waiters are woken to
        look again. Both caps change in one statement, never half-applied.
        """
        name = validate.name(name)
        read_n = validate.permits(read, "read", none=True)
        write_n = validate.permits(write, "write", none=False)
        statements = (
            queries.RESET_PERMITS if (read_n, write_n) == (None, 1) else queries.SET_PERMITS
        )
        self._backend.change(statements, {"name": name, "read": read_n, "write": write_n})

    def permits(self, name: str) -> Permits:
        """The caps `set_permits` gave ``name`` (the defaults if it never did)."""
        rows = self._backend.query(queries.PERMITS, {"name": validate.name(name)})
        if not rows:
            return Permits(read=None, write=1)
        return Permits(read=rows[0]["read_permits"], write=rows[0]["write_permits"])

    def release_all(self, app_id: str) -> int:
        """Release every lock of every session of ``app_id``, and expire those sessions.

        For start-up after a crash (seed 004's releaseAllLocks): call it
        before opening this run's sessions. Returns how many locks went.
        """
        found = self._backend.change(
            queries.RELEASE_ALL, {"app_id": validate.name(app_id, "app_id")}
        )
        return len(found[0])

    def break_lock(self, name: str) -> int:
        """Remove every holder of ``name`` (an administrator's override); returns how many.

        Every later grant carries a larger token, so a fence turns away the
        broken holder's writes once the new holder has used its token.
        """
        return len(self._backend.change(queries.BREAK_LOCK, {"name": validate.name(name)})[0])

    def clean(self) -> Cleaned:
        """Remove expired sessions with their locks and waits, and waits past their deadline."""
        self._backend.query(queries.EXPIRE_STALE, write=True)
        holders, waiters, sessions = self._backend.change(queries.CLEAN, {})
        return Cleaned(sessions=len(sessions), holders=len(holders), waiters=len(waiters))

    def locks(self, name: str | None = None) -> list[LockEntry]:
        """Every granted lock (or those on ``name``), stale ones included and flagged."""
        rows = self._backend.query(queries.LOCKS, {"name": _optional_name(name)})
        return [
            LockEntry(r["name"], Mode(r["mode"]), r["token"], holder_of(r), bool(r["stale"]))
            for r in rows
        ]

    def waiters(self, name: str | None = None) -> list[WaiterEntry]:
        """Every queued request (or those on ``name``), in queue order per name."""
        rows = self._backend.query(queries.WAITERS, {"name": _optional_name(name)})
        return [
            WaiterEntry(**r | {"mode": Mode(r["mode"]), "stale": bool(r["stale"])}) for r in rows
        ]

    def fence(self, resource: str) -> Fence:
        """The fence of a protected resource, kept in this store's database (D7)."""
        return Fence(self._backend, resource)

    def close(self) -> None:
        """Close every open session (releasing its locks), stop the threads, close connections."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._sessions)
        try:
            for session in sessions:
                session.close()
        finally:
            self._heartbeat.close()
            self._backend.close()

    def _forget(self, session: Session) -> None:
        self._heartbeat.remove(session)
        with self._lock:
            self._sessions.discard(session)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<lockwarden Store {self.url}>"


def _optional_name(name: str | None) -> str | None:
    return None if name is None else validate.name(name)


class Session:
    """One participant in the store: its locks live while its heartbeat does.

    Thread-safe: threads may share a session, but a session is one node of the
    deadlock graph, so give independent workers sessions of their own.
    """

    def __init__(
        self, store: Store, app_id: str, ttl: float, on_lost: Callable[[LockLost], None] | None
    ) -> None:
        self._store = store
        self._backend = store._backend
        self.id = secrets.token_hex(16)
        self.app_id = app_id
        self.ttl = ttl
        self._interval = ttl / 3
        self._margin = ttl * LEASE_MARGIN
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._held: dict[str, Stamp] = {}
        self._closed = False
        self._lost: LockLost | None = None
        self._lost_reported = False
        t0 = time.monotonic()
        rows = self._backend.query(
            queries.OPEN_SESSION,
            {
                "session": self.id,
                "app_id": app_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "ttl": ttl,
            },
            write=True,
        )
        self._started = rows[0]["started"]
        self._lease_deadline = t0 + ttl - self._margin
        self._next_beat = t0 + self._interval

    # -- taking locks ----------------------------------------------------------------

    def lock(
        self,
        name: str,
        mode: Mode | str = "write",
        timeout: float | None = None,
        on_stale: str | None = None,
    ) -> HeldLock:
        """Wait for ``name`` in ``mode`` ("read" or "write"), first come first served (D5).

        ``timeout``: None waits without limit, 0 tries once; `LockTimeout`
        (with ``blockers``) when it runs out. ``on_stale``: "reclaim" takes
        over from a holder whose session died, "refuse" raises
        `HolderUnresponsive` instead (default: the store's policy). Also
        `HeldTooLong` behind a holder older than the store's ``max_hold``,
        `Deadlock` if waiting would close a cycle of sessions, and `LockLost`
        if this session has lost its locks.
        """
        want = self._want([(name, mode)], timeout, on_stale)
        return self._finish(self._run(want), want, HeldLock)

    def try_lock(self, name: str, mode: Mode | str = "write") -> HeldLock | None:
        """One attempt: the lock, or None if it is busy (other failures raise as in `lock`)."""
        try:
            return self.lock(name, mode, timeout=0)
        except LockTimeout:
            return None

    def lock_many(
        self,
        items: Iterable[tuple[str, Mode | str]],
        timeout: float | None = None,
        on_stale: str | None = None,
    ) -> Stamp:
        """Acquire every (name, mode) at once or none of them (D6); waits like `lock`."""
        want = self._want(items, timeout, on_stale)
        return self._finish(self._run(want), want, Stamp)

    def try_lock_many(self, items: Iterable[tuple[str, Mode | str]]) -> Stamp | None:
        """One all-or-nothing attempt: the stamp, or None if any of the locks is busy."""
        try:
            return self.lock_many(items, timeout=0)
        except LockTimeout:
            return None

    def lock_async(
        self,
        name: str,
        mode: Mode | str = "write",
        timeout: float | None = None,
        on_stale: str | None = None,
    ) -> AsyncAcquire[HeldLock]:
        """`lock` for asyncio: ``await s.lock_async(...)``, or ``async with`` it (which releases).

        Cancelling the waiting task leaves no row behind.
        """
        want = self._want([(name, mode)], timeout, on_stale)
        return AsyncAcquire(self._acquire_async(want, HeldLock), Stamp.release)

    def lock_many_async(
        self,
        items: Iterable[tuple[str, Mode | str]],
        timeout: float | None = None,
        on_stale: str | None = None,
    ) -> AsyncAcquire[Stamp]:
        """`lock_many` for asyncio, used like `lock_async`."""
        want = self._want(items, timeout, on_stale)
        return AsyncAcquire(self._acquire_async(want, Stamp), Stamp.release)

    def Lock(self, name: str, mode: Mode | str = "write") -> SharedLock:  # noqa: N802
        """A `threading.Lock`-like object for ``name`` (named like kazoo's ``zk.Lock``)."""
        return SharedLock(self, name, mode)

    def _want(
        self, items: Iterable[tuple[str, Mode | str]], timeout: object, on_stale: object
    ) -> Want:
        checked = validate.items(items)
        wait = validate.timeout(timeout)
        refuse = validate.on_stale(self._store.on_stale if on_stale is None else on_stale)
        self._raise_if_unusable()
        return Want(
            session_id=self.id,
            items=checked,
            timeout=wait,
            refuse=refuse,
            max_hold=self._store.max_hold,
            lock_delay=self._store.lock_delay,
            lost=lambda: self._lose("the database no longer counts this session as live"),
        )

    def _run(self, want: Want) -> tuple[str, Mapping[str, int]]:
        steps = acquire_steps(self._backend, want)
        sub = Subscription(frozenset(name for name, _ in want.items))
        if want.timeout == 0:  # a try never waits: no need to listen
            return run_sync(steps, sub)
        with self._backend.wakeups.subscribe(sub):
            return run_sync(steps, sub)

    async def _acquire_async(self, want: Want, kind: type[S]) -> S:
        steps: Steps[tuple[str, Mapping[str, int]]] = acquire_steps(self._backend, want)
        sub = AsyncSubscription(
            frozenset(name for name, _ in want.items), asyncio.get_running_loop()
        )
        with self._backend.wakeups.subscribe(sub):
            granted = await run_async(steps, sub)
        return self._finish(granted, want, kind)

    def _finish(self, granted: tuple[str, Mapping[str, int]], want: Want, kind: type[S]) -> S:
        request_id, tokens = granted
        stamp = kind(
            self,
            request_id,
            tuple(Granted(name, mode, tokens[name]) for name, mode in want.items),
        )
        with self._lock:
            self._held[request_id] = stamp
        if self._lost is not None:  # lost while the grant was on its way: it is worth nothing
            self.release(stamp)
        return stamp

    # -- holding and releasing ------------------------------------------------------

    def release(self, stamp: Stamp) -> None:
        """Release a stamp (or a HeldLock) of this session.

        `NotHeld` for a stamp of another session, or one unknown or already
        released. `LockLost` if some of its locks had been lost meanwhile
        (what remained was released): the work done under it was not protected.
        """
        if not isinstance(stamp, Stamp):
            raise NotHeld(f"expected a Stamp or HeldLock of this session, got {stamp!r}")
        if stamp.session is not self:
            raise NotHeld(
                f"{stamp!r} belongs to another session ({stamp.session.id[:8]}), not this "
                f"one ({self.id[:8]}): release it through the session that took it"
            )
        with self._lock:  # taken out first: of two releases racing, one gets NotHeld
            if self._held.get(stamp.id) is not stamp:
                raise NotHeld(f"{stamp!r} is not held: it was never granted or is already released")
            del self._held[stamp.id]
        names = [g.name for g in stamp.locks]
        try:
            deleted = self._backend.release(self.id, stamp.id, names)
        except BaseException:
            with self._lock:  # still ours as far as we know: a later release may succeed
                self._held[stamp.id] = stamp
            raise
        if self._lost is not None or deleted < len(names):
            raise self._lost_error(stamp, " before it was released")

    def _check(self, stamp: Stamp) -> None:
        with self._lock:
            if self._held.get(stamp.id) is not stamp:
                raise NotHeld(f"{stamp!r} is not held: it was released")
        self._raise_if_unusable()
        names = [g.name for g in stamp.locks]
        row = self._backend.query(
            queries.CHECK, {"session": self.id, "request": stamp.id, "names": names}
        )[0]
        if not row["live"]:
            self._lose("the database no longer counts this session as live")
            raise self._lost_error(stamp, "")
        if row["held"] < len(stamp.locks):
            raise self._lost_error(stamp, " (it was broken or taken over)")

    def _lost_error(self, stamp: Stamp, when: str) -> LockLost:
        why = f"; the session was lost: {self._lost}" if self._lost is not None else ""
        first = stamp.locks[0]
        return LockLost(
            f"{describe([(g.name, g.mode) for g in stamp.locks])} (token {first.token}) "
            f"was no longer held by this session{when}{why}",
            name=first.name,
            token=first.token,
        )

    @property
    def lost(self) -> bool:
        """Whether this session has lost its locks (it cannot take new ones either)."""
        self._expire_lease()
        return self._lost is not None

    @property
    def held(self) -> list[Stamp]:
        """The stamps this session holds, as far as it knows."""
        with self._lock:
            return list(self._held.values())

    def close(self) -> None:
        """Release everything this session holds or waits for, and end it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._held.clear()
        self._store._forget(self)
        if self._lost is not None:
            self._report_loss()  # on_lost fires even if the heartbeat thread had no time to
        self._backend.change(queries.CLOSE_SESSION, {"session": self.id})

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "lost" if self._lost else "live"
        return f"<lockwarden Session {self.id[:8]} app={self.app_id!r} {state}>"

    # -- liveness -------------------------------------------------------------------

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise LockUsageError(f"{self!r} is closed: open a new session")
        self._expire_lease()
        if self._lost is not None:
            raise LockLost(f"{self!r} has lost its locks ({self._lost}): open a new session")

    def _expire_lease(self) -> None:
        if self._lost is None and time.monotonic() >= self._lease_deadline:
            self._lose(f"no heartbeat was confirmed for {self.ttl:g} s (the TTL)")

    def _lose(self, reason: str) -> LockLost:
        """Mark the session lost; the heartbeat thread reports it (on_lost) right away."""
        with self._lock:
            if self._lost is None:
                self._lost = LockLost(reason)
                self._next_beat = -math.inf
            lost = self._lost
        self._store._heartbeat.poke()
        return LockLost(f"{self!r} has lost its locks ({lost})")

    @property
    def next_beat(self) -> float:
        return self._next_beat

    def beat(self) -> None:
        """Called by the heartbeat thread: one heartbeat, or the report of a loss."""
        if self._closed:
            self._next_beat = math.inf
            return
        t0 = time.monotonic()
        self._expire_lease()
        if self._lost is None:
            try:
                rows = self._backend.query(queries.HEARTBEAT, {"session": self.id}, write=True)
            except Exception as exc:  # the lease deadline decides when this becomes a loss
                log.warning("heartbeat of %r failed, retrying: %s", self, exc)
                self._next_beat = t0 + self._interval / 2
                return
            if not rows:
                self._lose("the database says the session expired (its heartbeat was late)")
            elif self._backend.relaxed and rows[0]["started"] != self._started:
                self._lose(
                    "the database restarted, and with relaxed durability it may have "
                    "forgotten grants and releases made just before"
                )
            else:
                self._lease_deadline = t0 + self.ttl - self._margin
                self._next_beat = t0 + self._interval
                return
        self._report_loss()

    def _report_loss(self) -> None:
        with self._lock:
            self._next_beat = math.inf
            if self._lost_reported:
                return
            self._lost_reported = True
        try:  # its rows stop counting at once, not a TTL later
            self._backend.change(queries.EXPIRE_SESSION, {"session": self.id})
        except Exception as exc:
            log.warning("could not mark lost session %r expired: %s", self, exc)
        if self._on_lost is not None:
            try:
                self._on_lost(LockLost(f"{self!r} lost its locks: {self._lost}"))
            except Exception:
                log.exception("on_lost callback of %r raised", self)


@dataclass(frozen=True)
class Granted:
    """One lock of a stamp."""

    name: str
    mode: Mode
    token: int
    """The fencing token: larger than every earlier grant of this name (D7)."""


class Stamp:
    """A set of locks granted together, released together (D6).

    ``id`` is random and unguessable; a stamp only releases through the
    session that took it.
    """

    def __init__(self, session: Session, id: str, locks: tuple[Granted, ...]) -> None:
        self.session = session
        self.id = id
        self.locks = locks

    @property
    def tokens(self) -> dict[str, int]:
        return {g.name: g.token for g in self.locks}

    def check(self) -> None:
        """Ask the database whether every lock of the stamp is still ours; `LockLost` if not."""
        self.session._check(self)

    def release(self) -> None:
        self.session.release(self)

    def __enter__(self: S) -> S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        what = describe([(g.name, g.mode) for g in self.locks])
        return f"<{type(self).__name__} {self.id[:8]} {what}>"


class HeldLock(Stamp):
    """One granted lock: a stamp of one."""

    @property
    def name(self) -> str:
        return self.locks[0].name

    @property
    def mode(self) -> Mode:
        return self.locks[0].mode

    @property
    def token(self) -> int:
        return self.locks[0].token


class SharedLock:
    """A lock that behaves like `threading.Lock`, shared through the store.

    Not reentrant: acquiring it again while this object holds it is an error
    (a `threading.Lock` would deadlock). ``locked()`` is true while this
    object or anyone else holds the name.
    """

    def __init__(self, session: Session, name: str, mode: Mode | str = "write") -> None:
        self._session = session
        self.name = validate.name(name)
        self.mode = validate.mode(mode)
        self._held: HeldLock | None = None
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not blocking and timeout != -1:
            raise LockUsageError("can't specify a timeout for a non-blocking call")
        if blocking and timeout != -1 and (not isinstance(timeout, int | float) or timeout < 0):
            raise LockUsageError(f"timeout must be -1 (no limit) or >= 0, got {timeout!r}")
        wait = 0 if not blocking else None if timeout == -1 else timeout
        with self._lock:
            if self._held is not None:
                raise LockUsageError(f"this Lock already holds {self.name!r}; it is not reentrant")
        try:
            held = self._session.lock(self.name, self.mode, timeout=wait)
        except LockTimeout:
            return False
        with self._lock:
            self._held = held
        return True

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, None
        if held is None:
            raise NotHeld(f"release of {self.name!r}, which this Lock does not hold")
        held.release()

    def locked(self) -> bool:
        with self._lock:
            if self._held is not None:
                return True
        return any(not e.stale for e in self._session._store.locks(self.name))

    @property
    def token(self) -> int | None:
        """The fencing token while held."""
        held = self._held
        return None if held is None else held.token

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<SharedLock {self.name!r} {'held' if self._held else 'free'}>"


def connect(
    url: str,
    max_hold: float | None = 600.0,
    *,
    on_stale: str = "reclaim",
    lock_delay: float = 0.0,
    durability: str = "durable",
) -> Store:
    """Open the lock store at ``url``, creating or upgrading its tables (D1).

    ``url``: ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or
    ``postgresql://user@host:port/db?schema=NAME`` (default schema
    "lockwarden"; other parameters, such as ``application_name``, go to libpq).
    ``max_hold``: waiters fail with `HeldTooLong` behind a
    lock held longer (None: no limit). ``on_stale``: the default policy for
    a dead holder's lock, "reclaim" or "refuse". ``lock_delay``: seconds a
    reclaimed lock is withheld from its new holder. ``durability``:
    "durable", or "relaxed" (PostgreSQL only: lock transactions do not wait
    for the disk; see the design note for what a database crash then costs).
    """
    parsed = parse_url(url)
    hold = validate.max_hold(max_hold)
    validate.on_stale(on_stale)
    delay = validate.duration(lock_delay, "lock_delay")
    if durability not in ("durable", "relaxed"):
        raise LockUsageError(f"durability must be 'durable' or 'relaxed', got {durability!r}")
    backend: Backend
    if parsed.backend == "sqlite":
        if durability == "relaxed":
            raise LockUsageError(
                "relaxed durability is for PostgreSQL only: a SQLite grant is cheap to make durable"
            )
        backend = SQLiteBackend(parsed)
    else:
        backend = PostgresBackend(parsed, relaxed=durability == "relaxed")
    return Store(backend, max_hold=hold, on_stale=on_stale, lock_delay=delay)
