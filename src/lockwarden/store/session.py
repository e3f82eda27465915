"""`Session`: one participant in a store, kept alive by the store's heartbeat thread
(one statement per session per interval, however many locks it holds), with its
lease on its own clock. A session takes locks; what it gets back is a `Stamp` (a
set of locks granted together) or its one-lock form, a `HeldLock`; `SharedLock`
is a lock the threads of one program share. They live here with the session
because each is a view of the session's table of what it holds, and the session
makes them: apart, the two modules would import each other. See the design note
(README.md in this package) for the algorithm and why it is safe."""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

from lockwarden import hooks
from lockwarden.errors import (
    Deadlock,
    LockError,
    LockLost,
    LockTimeout,
    LockUsageError,
    NotHeld,
    StoreError,
)
from lockwarden.modes import Mode
from lockwarden.store import bounds, lease, process, validate
from lockwarden.store.backends.base import STORE_LOG, random_hex
from lockwarden.store.retry import jittered
from lockwarden.store.waiting import Grant, Want, acquire, acquire_steps, describe, give_back

if TYPE_CHECKING:
    from lockwarden.store.aio import AsyncAcquire
    from lockwarden.store.backends.base import Backend
    from lockwarden.store.heartbeat import Heartbeat
    from lockwarden.store.status import LockEntry

S = TypeVar("S", bound="Stamp")


class Store(Protocol):
    """What a session needs of the store that opened it (`store.Store`, which imports this
    module to make sessions)."""

    max_hold: float | None
    on_stale: str
    lock_delay: float

    @property
    def _backend(self) -> Backend: ...
    @property
    def _heartbeat(self) -> Heartbeat: ...
    def locks(self, name: str | None = None) -> list[LockEntry]: ...
    def _forget(self, session: Session) -> None: ...


_RELEASE_RETRY = 0.05
"""The first pause (before jitter, doubling up to the heartbeat interval) before a failed
release is sent again."""


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
        self._pid = os.getpid()
        self.id = self._backend.new_session_id()
        self.app_id = app_id
        self.ttl = ttl
        self._interval = ttl / 3
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._held: dict[str, Stamp] = {}
        self._holding: dict[str, list[Stamp]] = {}
        """The stamps of `_held` by each name they hold (`_refuse_reentry` looks a name up
        there, not through every stamp: a session may hold a hundred thousand locks)."""
        self._closed = False
        self._lost: LockLost | None = None
        self._lost_reported = False
        self._release_queue: deque[Stamp] = deque()
        self._releasing: dict[str, tuple[str, ...]] = {}
        """Releases sent but not confirmed: request id -> names (`_retry_release`)."""
        self._release_failures = 0
        self._next_retry = math.inf
        t0, sent = time.monotonic(), lease.now()
        row = self._backend.open_session(
            session=self.id,
            app_id=app_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            pid_start=process.identity(),
            ttl=ttl,
        )
        self._started = row["started"]
        self._deadline = lease.deadline(sent, ttl)
        """When (`lease.now`) the lease runs out unless a heartbeat moves it on."""
        self._next_beat = t0 + self._interval
        self._failing_since: float | None = None
        """When the heartbeat began to fail (None while it succeeds): one warning an outage."""

    # -- taking locks ----------------------------------------------------------------

    def lock(
        self,
        name: str,
        mode: Mode | str = "write",
        timeout: float | None = None,
        on_stale: str | None = None,
    ) -> HeldLock:
        """Wait for ``name`` in ``mode`` ("read" or "write"), first come first served.

        ``timeout``: None waits without limit, 0 tries once; `LockTimeout`
        (with ``blockers``) when it runs out. ``on_stale``: "reclaim" takes
        over from a holder whose session died, "refuse" raises
        `HolderUnresponsive` instead (default: the store's policy). Also
        `HeldTooLong` behind a holder older than the store's ``max_hold``,
        `Deadlock` if waiting would close a cycle of sessions, and `LockLost`
        if this session has lost its locks.
        """
        want = self._want([(name, mode)], timeout, on_stale)
        return self._take(want, HeldLock)

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
        """Acquire every (name, mode) at once or none of them; waits like `lock`."""
        want = self._want(items, timeout, on_stale)
        return self._take(want, Stamp)

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
        from lockwarden.store.aio import AsyncAcquire  # noqa: PLC0415  (see _acquire_async)

        want = self._want([(name, mode)], timeout, on_stale)
        return AsyncAcquire(self._acquire_async(want, HeldLock), Stamp.release)

    def lock_many_async(
        self,
        items: Iterable[tuple[str, Mode | str]],
        timeout: float | None = None,
        on_stale: str | None = None,
    ) -> AsyncAcquire[Stamp]:
        """`lock_many` for asyncio, used like `lock_async`."""
        from lockwarden.store.aio import AsyncAcquire  # noqa: PLC0415  (see _acquire_async)

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
        self._refuse_reentry(checked)
        return Want(
            session_id=self.id,
            request_id=random_hex(16),
            items=checked,
            timeout=wait,
            refuse=refuse,
            max_hold=self._store.max_hold,
            lock_delay=self._store.lock_delay,
            lost=lambda: self._lose("the database no longer counts this session as live"),
            abandon=self._abandon,
        )

    def _refuse_reentry(self, items: Sequence[tuple[str, Mode]]) -> None:
        """`LockUsageError` if the caller (this thread, or this asyncio task) already holds
        one of ``items``' names through this session.

        Its request would queue behind its own lock and wait for itself: for
        ever, or until its timeout, with a busy message naming its own app. Locks
        are not reentrant (as `threading.Lock`); another thread or task of the
        session may still wait for a name this one holds, as it would for
        anyone's.
        """
        caller = _caller()
        with self._lock:
            mine = [
                g
                for name, _ in items
                for stamp in self._holding.get(name, ())
                if stamp._owner == caller and not stamp._gone
                for g in stamp.locks
                if g.name == name
            ]
        if mine:
            g = mine[0]
            raise LockUsageError(
                f"this {'task' if not isinstance(caller, int) else 'thread'} already holds "
                f"{describe([(g.name, g.mode)])} (token {g.token}) through {self!r}: locks are "
                "not reentrant, and the request would wait for itself. Release it first, or "
                "keep the lock you hold"
            )

    def _take(self, want: Want, kind: type[S]) -> S:
        """The stamp of ``want``, granted and recorded as this session's; or the request
        given back, whatever cut the call short.

        A `LockError` comes from the waiting loop, which gave back what the
        request left. Any other exception (KeyboardInterrupt; whatever a signal's
        handler or an observer raises) may come after the database granted the
        request and before its stamp is recorded, when nobody has the stamp to
        release it: the lock would stay held until the session ends. The request
        is given back once more; a release of a request id deletes only its rows,
        so giving back twice costs a round trip and nothing else.
        """
        try:
            return self._finish(self._run(want), want, kind)
        except LockError:
            raise
        except BaseException as exc:
            self._give_back(want, exc)
            raise

    def _unhold(self, request_id: str) -> None:
        """Take a stamp out of `_held` and `_holding` (the session's lock held)."""
        stamp = self._held.pop(request_id, None)
        if stamp is None:
            return
        for g in stamp.locks:
            holding = self._holding.get(g.name, [])
            if stamp in holding:
                holding.remove(stamp)
            if not holding:
                self._holding.pop(g.name, None)

    def _give_back(self, want: Want, exc: BaseException) -> None:
        """Forget a request that may have been granted but never reached its caller, and
        give it back (``exc`` is what the caller gets)."""
        with self._lock:
            self._unhold(want.request_id)
        give_back(want, exc)

    def _run(self, want: Want) -> Grant:
        if not hooks.active():
            return acquire(self._backend, want)
        with _reporting(want):
            return acquire(self._backend, want)

    async def _acquire_async(self, want: Want, kind: type[S]) -> S:
        """`_take` for asyncio: the same rule, with a cancellation beside `LockError`
        (the waiting loop gave back what it left, ``aio.py``). Anything else gives the
        request back from a worker thread, so the event loop is not held up."""
        # asyncio takes tens of milliseconds to import: only its users pay for it,
        # not a threaded program or `lockwarden run`, whose start-up every call pays.
        import asyncio  # noqa: PLC0415

        from lockwarden.store.aio import run_async  # noqa: PLC0415

        try:
            with _reporting(want):
                granted = await run_async(
                    acquire_steps(self._backend, want),
                    self._backend.wakeups,
                    pokes=self._backend.pokes,
                )
            return self._finish(granted, want, kind)
        except (LockError, asyncio.CancelledError):
            raise
        except BaseException as exc:
            await asyncio.to_thread(self._give_back, want, exc)
            raise

    def _finish(self, granted: Grant, want: Want, kind: type[S]) -> S:
        request_id, tokens = granted
        stamp = kind(
            self,
            request_id,
            tuple(Granted(name, mode, tokens[name]) for name, mode in want.items),
        )
        stamp._owner = _caller()
        with self._lock:
            self._held[request_id] = stamp
            for g in stamp.locks:
                self._holding.setdefault(g.name, []).append(stamp)
        # Lost while the grant was on its way (a waiter paused past its lease gets its
        # grant as it resumes, before the lease timer has run): it is worth nothing.
        if self._expire_lease():
            self.release(stamp)
        return stamp

    # -- holding and releasing ------------------------------------------------------

    def release(self, stamp: Stamp) -> None:
        """Release a stamp (or a HeldLock) of this session.

        `NotHeld` for a stamp of another session, or one unknown or already
        released. `LockLost` if some of its locks had been lost meanwhile
        (what remained was released): the work done under it was not protected.
        `StoreError` if the database could not be reached: the stamp is no longer
        this session's all the same (releasing it again raises `NotHeld`), and the
        release is sent again in the background until the database confirms it
        (`releasing` counts those), so the lock is freed as soon as the database
        is back, not when the session ends.
        """
        self._check_process()
        if not isinstance(stamp, Stamp):
            raise NotHeld(
                f"expected a Stamp or HeldLock of this session, got {validate.shown(stamp)}"
            )
        if stamp.session is not self:
            raise NotHeld(
                f"{stamp!r} belongs to another session ({stamp.session.id[:8]}), not this "
                f"one ({self.id[:8]}): release it through the session that took it"
            )
        names = [g.name for g in stamp.locks]
        taken = False  # out of `_held`: from then on, this call sees the release through
        try:
            with self._lock:  # taken out first: of two releases racing, one gets NotHeld
                if self._held.get(stamp.id) is not stamp:
                    raise NotHeld(
                        f"{stamp!r} is not held: it was never granted or is already released"
                    )
                self._unhold(stamp.id)
                taken = True
            # A lost session's rows count for nothing (the loss expired them, `close` or
            # `clean` deletes them): no call that a partition could hold up.
            lost = self._expire_lease()
            deleted = 0 if lost else self._backend.release(self.id, stamp.id, names)
        except BaseException as exc:
            if not taken:
                raise
            self._retry_release(stamp.id, names)
            if isinstance(exc, StoreError):
                raise StoreError(
                    f"{exc}. The release of {stamp!r} is retried in the background until the "
                    "database confirms it (or this session ends); the stamp is no longer "
                    "this session's"
                ) from exc
            raise
        if hooks.active():
            held = time.monotonic() - stamp._granted
            for g in stamp.locks:
                hooks.emit("released", g.name, g.mode.word, held)
        if self._lost is not None or deleted < len(names):
            raise self._lost_error(stamp, " before it was released")

    def _abandon(self, request_id: str, names: Sequence[str], later: bool = False) -> None:
        """Remove what a request that stops waiting left behind (possibly a grant
        committed just before its connection dropped); retried in the background if
        the database cannot be reached now, or (``later``) only in the background."""
        if later:
            self._retry_release(request_id, names)
            return
        try:
            self._backend.release(self.id, request_id, names)
        except BaseException:
            self._retry_release(request_id, names)
            raise

    def _retry_release(self, request_id: str, names: Sequence[str]) -> None:
        """Hand a release whose outcome is unknown to the heartbeat thread.

        A release is idempotent (it deletes the rows of one request id), so it
        is sent again until the database confirms it; meanwhile the heartbeat
        keeps the session, and so the lock, alive: without this a lock whose
        release met an outage stayed held for the life of the session. The
        retries stop when the session is lost or closed (its rows then stop
        counting, or are deleted).
        """
        with self._lock:
            self._releasing[request_id] = tuple(names)
            self._release_failures = 0
            self._next_retry = time.monotonic() + jittered(_RELEASE_RETRY)
        self._store._heartbeat.poke()

    def _retry_releases(self) -> None:
        with self._lock:
            pending = dict(self._releasing)
        for request_id, names in pending.items():
            try:
                self._backend.release(self.id, request_id, names)
            except Exception as exc:
                hooks.logger(STORE_LOG).debug(
                    "release of %s by %r not confirmed yet: %s", names, self, exc
                )
                continue
            hooks.logger(STORE_LOG).info(
                "release of %s by %r confirmed after a failure", list(names), self
            )
            with self._lock:
                self._releasing.pop(request_id, None)
        with self._lock:
            self._release_failures += 1
            backoff = min(_RELEASE_RETRY * 2**self._release_failures, self._interval)
            self._next_retry = time.monotonic() + jittered(backoff) if self._releasing else math.inf

    @property
    def releasing(self) -> int:
        """How many releases are still being retried in the background (their locks may
        still count as held in the database until confirmed)."""
        with self._lock:
            return len(self._releasing)

    def _check(self, stamp: Stamp) -> None:
        with self._lock:
            if self._held.get(stamp.id) is not stamp:
                raise NotHeld(f"{stamp!r} is not held: it was released")
        self._raise_if_unusable()
        names = [g.name for g in stamp.locks]
        try:  # an answer after the lease's end would prove nothing: wait no longer for one
            with bounds.within(self._deadline - lease.now()):
                row = self._backend.check(self.id, stamp.id, names)
        except StoreError:
            self._expire_lease()
            if self._lost is not None:
                raise self._lost_error(stamp, "") from None
            raise
        self._expire_lease()
        if self._lost is not None:
            raise self._lost_error(stamp, "")
        if not row["live"]:
            self._lose("the database no longer counts this session as live")
            raise self._lost_error(stamp, "")
        if row["held"] < len(stamp.locks):
            stamp._gone = True  # known gone: asking for its names again is no reentry
            raise self._lost_error(stamp, "")

    def _lost_error(self, stamp: Stamp, when: str) -> LockLost:
        """The `LockLost` of ``stamp``: lost with the session (``when``: the moment, as
        " before it was released"), or, the session being live, broken or taken over."""
        first = stamp.locks[0]
        what = f"{describe([(g.name, g.mode) for g in stamp.locks])} (token {first.token})"
        return LockLost(
            f"{what} was lost with its session{when}: {self._lost}"
            if self._lost is not None
            else f"{what} was broken or taken over while held",
            name=first.name,
            token=first.token,
        )

    @property
    def lost(self) -> bool:
        """Whether this session has lost its locks (it cannot take new ones either)."""
        self._check_process()
        self._expire_lease()
        return self._lost is not None

    @property
    def held(self) -> list[Stamp]:
        """The stamps this session holds, as far as it knows."""
        self._check_process()
        with self._lock:
            return list(self._held.values())

    @property
    def expires_at(self) -> float:
        """When (seconds since the epoch, this host's clock) the lease runs out.

        The lease is what keeps every lock of the session alive: unless a
        heartbeat is confirmed before this moment, the locks may pass to
        someone else from then on (the session reports itself lost). Each
        confirmed heartbeat, every TTL/3, moves it to about TTL - TTL/10 after
        the heartbeat was sent; `renew` moves it now.
        """
        return time.time() + (self._deadline - lease.now())

    @property
    def lease_left(self) -> float:
        """Seconds until the lease runs out (0 once lost), on a clock that never jumps.

        `expires_at` as a span: unaffected by changes to the wall clock. A
        program that must stop before its locks can pass on (`lockwarden run`
        stops its command so) stops within this, unless a heartbeat moves it.
        """
        self._check_process()
        if self._expire_lease():
            return 0.0
        return max(0.0, self._deadline - lease.now())

    def renew(self) -> float:
        """Send a heartbeat now, and return the new `expires_at`.

        The session is the unit of liveness, so this renews every lock it
        holds. `LockLost` if the database no longer counts the session as
        live; `StoreError` if the database cannot be reached (the lease
        then runs on to its old deadline, and the heartbeat thread keeps trying).
        """
        self._raise_if_unusable()
        self._renew_lease()
        return self.expires_at

    def close(self) -> None:
        """Release everything this session holds or waits for, and end it.

        In a forked child the session is its parent's: closing it there
        only stops this process from using it.
        """
        if os.getpid() != self._pid:
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._held.clear()
            self._holding.clear()
            self._releasing.clear()  # the session's rows all go below
        self._store._forget(self)
        if self._lost is not None:  # on_lost fires even if its reporter had no time to
            self._report_loss(expire=False)  # the rows go below
        self._backend.close_session(self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "lost" if self._lost else "live"
        return f"<lockwarden Session {self.id[:8]} app={self.app_id!r} {state}>"

    # -- liveness -------------------------------------------------------------------

    def _check_process(self) -> None:
        # Before any lock is taken: a parent's thread may have held it at the fork.
        if os.getpid() != self._pid:
            raise process.forked_session(self._pid)

    def _raise_if_unusable(self) -> None:
        self._check_process()
        if self._closed:
            raise LockUsageError(f"{self!r} is closed: open a new session")
        self._expire_lease()
        if self._lost is not None:
            raise LockLost(f"{self!r} has lost its locks ({self._lost}): open a new session")

    def _expire_lease(self) -> bool:
        """Mark the session lost if its lease has run out on this host's clock; whether
        it is lost."""
        if self._lost is None and lease.now() >= self._deadline:
            self._lose(
                f"its lease ran out: no heartbeat was confirmed for "
                f"{self.ttl * (1 - lease.MARGIN):g} s, and its locks may pass on "
                f"{self.ttl:g} s (the TTL) after the last one"
            )
        return self._lost is not None

    @property
    def _lease_deadline(self) -> float:
        """When (`lease.now`) the lease runs out; infinity once lost or closed."""
        return math.inf if self._lost is not None or self._closed else self._deadline

    def _lease_ended(self) -> None:
        """Called by the store's lease timer at the deadline, whatever the heartbeat is doing."""
        self._expire_lease()

    def _lose(self, reason: str) -> LockLost:
        """Mark the session lost, and report it (``on_lost``) from a thread of its own.

        The report must not wait for anything: the heartbeat thread may be
        stuck in a call that a partition holds up, and whoever called this
        (the lease timer, a lock call) has its own work to finish.
        """
        with self._lock:
            first = self._lost is None
            if first:
                self._lost = LockLost(reason)
                self._next_beat = math.inf
            lost = self._lost
            held = [g for stamp in self._held.values() for g in stamp.locks]
        if first:
            if hooks.active():
                for g in held:
                    hooks.emit("lost", g.name, g.mode.word)
            reporter = threading.Thread(
                target=self._report_loss, name="lockwarden-lost", daemon=True
            )
            try:
                reporter.start()
            except RuntimeError:  # the interpreter is shutting down: no new threads
                self._report_loss()
        return LockLost(f"{self!r} has lost its locks ({lost})")

    def _report_loss(self, *, expire: bool = True) -> None:
        """Call ``on_lost`` (once), then mark the session expired in the database unless
        ``expire`` is false (a close deletes its rows instead)."""
        with self._lock:
            if self._lost_reported:
                return
            self._lost_reported = True
        if self._on_lost is not None:
            try:
                self._on_lost(LockLost(f"{self!r} lost its locks: {self._lost}"))
            except Exception:
                hooks.logger(STORE_LOG).exception("on_lost callback of %r raised", self)
        if not expire or self._closed:
            return
        try:  # its rows stop counting now, not when the database's clock passes the TTL
            self._backend.expire_session(self.id)
        except Exception as exc:
            hooks.logger(STORE_LOG).info("could not mark lost session %r expired: %s", self, exc)

    @property
    def _beat_due(self) -> float:
        return min(self._next_beat, self._next_retry)

    def _beat(self) -> None:
        """Called by the heartbeat thread: a heartbeat when due; then the releases to
        retry, when due."""
        if self._closed:
            self._next_beat = self._next_retry = math.inf
            return
        self._release_queued()
        if time.monotonic() >= self._next_beat and not self._expire_lease():
            self._heartbeat()
        if time.monotonic() >= self._next_retry:
            if self._lost is None:
                self._retry_releases()
            else:  # its rows no longer count: nothing left to release
                with self._lock:
                    self._releasing.clear()
                    self._next_retry = math.inf

    def _heartbeat(self) -> None:
        """One beat from the heartbeat thread; a failure is tried again until the lease
        runs out (the lease timer, not this thread, decides when that is)."""
        t0 = time.monotonic()
        try:
            self._renew_lease()
        except LockLost:
            return  # marked and reported by `_lose`
        except Exception as exc:
            if self._lost is not None:
                return
            log = hooks.logger(STORE_LOG)
            if self._failing_since is None:  # one warning an outage, not one a beat
                self._failing_since = t0
                log.warning(
                    "heartbeat of %r failed; tried again until its lease runs out: %s", self, exc
                )
            else:
                log.debug("heartbeat of %r failed again: %s", self, exc)
            # The pause counts from when this beat began: one that waited out its whole
            # bound (a partition) is tried again at once, on another connection.
            self._next_beat = max(time.monotonic(), t0 + jittered(self._interval / 2))
            return
        if self._failing_since is not None:
            hooks.logger(STORE_LOG).info(
                "heartbeat of %r confirmed again after %.1f s of failures",
                self,
                t0 - self._failing_since,
            )
            self._failing_since = None

    def _renew_lease(self) -> None:
        """One heartbeat: move the lease deadline on, or raise `LockLost` and mark the loss.

        The call is bounded by the lease, and by half the beat interval, so
        that a call stuck on a dead connection is tried again on another well
        before the lease is at risk (`lockwarden run` stops its command once a
        quarter of the TTL is left); and
        its reply counts only if it arrives before the deadline it would move
        (`lease`): a later one proves nothing, and never revives the session.
        """
        t0, sent = time.monotonic(), lease.now()
        with bounds.within(min(self._interval / 2, self._deadline - sent)):
            rows = self._backend.heartbeat(self.id)
        if not rows:
            raise self._lose(
                "the database no longer has the session as live (a heartbeat came too late, "
                "or the session was expired, or the server that has it now never saw it)"
            )
        if self._backend.relaxed and rows[0]["started"] != self._started:
            raise self._lose(
                "the database restarted or failed over, and with relaxed durability it "
                "may have forgotten grants and releases made just before"
            )
        with self._lock:
            if self._lost is None and lease.now() < self._deadline:
                self._deadline = max(self._deadline, lease.deadline(sent, self.ttl))
                self._next_beat = 0.0 if self._release_queue else t0 + self._interval
                return
        self._expire_lease()  # the reply came after the deadline (or a loss meanwhile)
        raise LockLost(f"{self!r} has lost its locks ({self._lost})")

    def _release_later(self, stamp: Stamp) -> None:
        """Have the heartbeat thread release ``stamp`` (at its next beat, brought forward).

        For a finalizer: it may run in any thread, in the middle of anything,
        so it takes no lock and sends nothing itself.
        """
        if os.getpid() != self._pid or self._closed:
            return  # a forked child's copy, or already released with the session
        self._release_queue.append(stamp)
        self._next_beat = 0.0
        self._store._heartbeat.poke()

    def _release_queued(self) -> None:
        while self._release_queue:
            stamp = self._release_queue.popleft()
            try:
                self.release(stamp)
            except NotHeld:
                pass  # released meanwhile, or with the session
            except Exception as exc:  # lost, or the database is unreachable: the TTL frees it
                hooks.logger(STORE_LOG).warning("releasing dropped %r failed: %s", stamp, exc)


def _caller() -> object:
    """Who calls: the asyncio task running on this thread, if any, else the thread (its
    ident). asyncio is asked only if some code of the process imported it."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no event loop runs on this thread
            task = None
        if task is not None:
            return task
    return threading.get_ident()


@contextmanager
def _reporting(want: Want) -> Iterator[None]:
    """Tell `lockwarden.hooks` how a lock call ended: granted, timed out or refused."""
    if not hooks.active():
        yield
        return
    since = time.monotonic()
    try:
        yield
    except LockTimeout:
        for name, mode in want.items:
            hooks.emit("timed_out", name, mode.word, time.monotonic() - since)
        raise
    except Deadlock:
        for name, mode in want.items:
            hooks.emit("deadlock", name, mode.word)
        raise
    for name, mode in want.items:
        hooks.emit("acquired", name, mode.word, time.monotonic() - since)


class Granted(NamedTuple):
    """One lock of a stamp."""

    name: str
    mode: Mode
    token: int
    """The fencing token: larger than every earlier grant of this name."""


class Stamp:
    """A set of locks granted together, released together.

    ``id`` is random and unguessable; a stamp only releases through the
    session that took it.
    """

    def __init__(self, session: Session, id: str, locks: tuple[Granted, ...]) -> None:
        self.session = session
        self.id = id
        self.locks = locks
        self._granted = time.monotonic()  # for the hold time `lockwarden.hooks` reports
        self._owner: object = None
        """The thread (ident) or asyncio task that took it (`Session._refuse_reentry`)."""
        self._gone = False
        """`check` found some of its locks gone (broken, taken over): taking them again
        is no reentry."""

    @property
    def tokens(self) -> dict[str, int]:
        return {g.name: g.token for g in self.locks}

    def check(self) -> None:
        """Ask the database whether every lock of the stamp is still ours; `LockLost` if not."""
        self.session._check(self)

    def owned(self) -> bool:
        """Ask the database whether every lock of the stamp is still ours (`check` as a bool)."""
        try:
            self.check()
        except (LockLost, NotHeld):
            return False
        return True

    def extend(self) -> float:
        """Renew the lease that keeps these locks alive, and confirm they are still ours.

        A lock has no deadline of its own: its session's lease keeps it (and
        every other lock of the session) alive. So this is an immediate
        heartbeat of the session (`Session.renew`) followed by `check`. It
        returns the new `expires_at`. `LockLost` if the session was lost or
        the locks were broken or taken over; `NotHeld` once released.
        """
        self.session.renew()
        self.check()
        return self.session.expires_at

    @property
    def expires_at(self) -> float | None:
        """The session's lease deadline (`Session.expires_at`) while this stamp is held, else None.

        The same on every backend: the locks are safe to rely on until then;
        the heartbeat moves it on every TTL/3, `extend` at once.
        """
        session = self.session
        if session.lost or self not in session.held:
            return None
        return session.expires_at

    def _fence_claim(self, resource: str) -> tuple[str, str, int]:
        """What a fence checks for this stamp's lock guarding ``resource`` (`Fence`): the
        lock named ``resource``, or the stamp's only lock. `LockLost` at once if this
        session knows the lock is gone."""
        mine = [g for g in self.locks if g.name == resource] or (
            list(self.locks) if len(self.locks) == 1 else []
        )
        if not mine:
            raise LockUsageError(
                f"{self!r} holds several locks, none named {resource!r}: give the fence "
                "the token of the lock that guards it"
            )
        with self.session._lock:
            held = self.session._held.get(self.id) is self
        if not held:
            raise NotHeld(f"{self!r} is not held (released): it cannot use fence {resource!r}")
        if self.session.lost:
            raise self.session._lost_error(self, f", so fence {resource!r} refused it")
        return self.session.id, self.id, mine[0].token

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

    async def __aenter__(self: S) -> S:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release from a worker thread: the event loop does not wait for the database."""
        import asyncio  # noqa: PLC0415  (its users alone pay for it: see `_acquire_async`)

        await asyncio.to_thread(self.release)

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

    def locked(self) -> bool:
        """Whether anyone (this holder included, while it holds it) holds the name (one query)."""
        return _locked(self.session, self.name)


def _locked(session: Session, name: str) -> bool:
    return any(not e.stale for e in session._store.locks(name))


class SharedLock:
    """A lock that behaves like `threading.Lock`, shared through the store.

    Threads of this process share one object as they would a
    `threading.Lock`: while it is held, another thread's ``acquire(False)``
    returns False and a blocking ``acquire()`` waits (with ``timeout``, up to
    that long). Any thread may release it. Like `threading.Lock` it is not
    reentrant: acquiring it again from the thread that holds it waits for a
    release. Threads queue on a local lock first, so one object takes the
    name in the store at most once. An object dropped while held is released
    by the heartbeat thread once it is garbage-collected.
    """

    def __init__(self, session: Session, name: str, mode: Mode | str = "write") -> None:
        self._session = session
        self.name = validate.name(name)
        self.mode = validate.mode(mode)
        self._gate = threading.Lock()
        """Held while this object holds the name: threads of this process queue on it."""
        self._lock = threading.Lock()
        self._held: HeldLock | None = None
        self._finalizer: weakref.finalize[[Stamp], SharedLock] | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock: True once held, False if it was busy (``blocking=False``) or the
        ``timeout`` (seconds; -1: no limit) ran out. Other failures raise as in `Session.lock`."""
        if not blocking and timeout != -1:
            raise LockUsageError("can't specify a timeout for a non-blocking call")
        wait = 0.0 if not blocking else None if timeout == -1 else validate.timeout(timeout)
        deadline = None if wait is None else time.monotonic() + wait
        if not self._gate.acquire(timeout=-1 if wait is None else min(wait, threading.TIMEOUT_MAX)):
            return False
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            held = self._session.lock(self.name, self.mode, timeout=left)
        except LockTimeout:
            self._gate.release()
            return False
        except BaseException:
            self._gate.release()
            raise
        finalizer = weakref.finalize(self, self._session._release_later, held)
        finalizer.atexit = False  # at exit the store's close releases it
        with self._lock:
            self._held, self._finalizer = held, finalizer
        return True

    def release(self) -> None:
        """Release the lock (from any thread); `NotHeld` if it is not held."""
        with self._lock:
            held, self._held = self._held, None
            finalizer, self._finalizer = self._finalizer, None
        if held is None or finalizer is None:
            raise NotHeld(f"release of {self.name!r}, which this Lock does not hold")
        finalizer.detach()
        try:
            held.release()
        finally:
            self._gate.release()

    def locked(self) -> bool:
        """Whether this object, or anyone else, holds the name."""
        return self._gate.locked() or _locked(self._session, self.name)

    def owned(self) -> bool:
        """Whether this object holds the name, as the database confirms (`Stamp.owned`)."""
        held = self._held
        return held is not None and held.owned()

    def extend(self) -> float:
        """Renew the lease while held (`Stamp.extend`); `NotHeld` if not held."""
        held = self._held
        if held is None:
            raise NotHeld(f"extend of {self.name!r}, which this Lock does not hold")
        return held.extend()

    @property
    def expires_at(self) -> float | None:
        """The lease deadline while held (`Stamp.expires_at`), else None."""
        held = self._held
        return None if held is None else held.expires_at

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
