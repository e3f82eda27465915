"""`Store`: one database holding a lock store, the sessions it opened, and the
administrators' overrides (breaking a lock, expiring an app, cleaning up, permits)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable

from lockwarden import hooks
from lockwarden.errors import (
    LockLost,
    LockTimeout,
    LockUsageError,
)
from lockwarden.modes import Mode
from lockwarden.store import open_stores, validate
from lockwarden.store.backends.base import Backend, Stats, random_hex
from lockwarden.store.fence import Fence
from lockwarden.store.heartbeat import Heartbeat
from lockwarden.store.lease import LeaseTimer
from lockwarden.store.session import Session
from lockwarden.store.status import (
    AdminAction,
    Cleaned,
    LockEntry,
    Permits,
    SessionEntry,
    WaitEdge,
    WaiterEntry,
    holder_of,
)

ADMIN_LOG = "lockwarden.admin"
"""Where administrators' overrides are logged (INFO: a deliberate act, recorded in the store
too, `Store.admin_log`; the command line shows it with --verbose)."""

_ADMIN_APP = "lockwarden-admin"
"""The app id of the session an administrator's operation waits in."""


class Store:
    """A lock store in one database. Make one with `lockwarden.connect`.

    A store serves the process that opened it and, after ``fork()``, each
    child too: the first use in a new process opens that process's own
    connections and threads (`_adopt`). Sessions are each process's own.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        max_hold: float | None,
        on_stale: str,
        lock_delay: float,
        reopen: Callable[[], Backend],
    ) -> None:
        self._own_backend = backend
        self._reopen = reopen
        """Opens the store again, with the same URL and options, for a forked child."""
        self._parents: list[Backend] = []
        """In a forked child, the backends of the processes it descends from: never used
        here, and kept referenced so that nothing here closes their connections."""
        self._fork_lock = threading.Lock()
        self.max_hold = max_hold
        """Waiters give up with `HeldTooLong` behind a lock held longer than this."""
        self.on_stale = on_stale
        """The default stale policy of `Session.lock`: "reclaim" or "refuse"."""
        self.lock_delay = lock_delay
        """Seconds a lock taken over from a dead holder is withheld from its new holder."""
        self._heartbeat = Heartbeat()
        self._leases = LeaseTimer()
        self._sessions: set[Session] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        open_stores.STORES.add(self)

    @property
    def _inherited(self) -> bool:
        """This process was forked from the one the store serves, and has not used it yet."""
        return os.getpid() != self._pid

    @property
    def _backend(self) -> Backend:
        """The backend of this process: a forked child's first use opens its own."""
        if self._inherited:
            self._adopt()
        return self._own_backend

    def _check_process(self) -> None:
        """Make the store this process's, if it was forked from the one the store served."""
        if self._inherited:
            self._adopt()

    def _adopt(self) -> None:
        """Serve this forked child: its own connections and threads, no sessions yet.

        The parent's backend stays the parent's: its connections are neither used
        nor closed here (closing one would end the parent's session with the
        server). The locks were renewed at the fork (`_after_fork_in_child`),
        so no lock a parent's thread held then is taken here.
        """
        with self._fork_lock:
            if not self._inherited:
                return
            self._lock = threading.Lock()
            self._heartbeat = Heartbeat()
            self._leases = LeaseTimer()
            self._sessions = set()
            self._parents.append(self._own_backend)
            if not self._closed:
                self._own_backend = self._reopen()
            self._pid = os.getpid()
        if self._closed:
            raise LockUsageError("this store is closed")

    @property
    def url(self) -> str:
        """The store's URL, without any password."""
        return self._own_backend.url.display

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
        """Open a session: the unit of liveness for every lock it takes.

        ``ttl`` is how long the session survives without a heartbeat (beats
        come every ttl/3). ``on_lost`` is called once, with a `LockLost`, if
        the session loses its locks (from the heartbeat thread, or from
        `Session.close` if that comes first).
        """
        self._check_process()
        app_id = validate.name(app_id, "app_id")
        ttl_s = validate.ttl(ttl)
        if on_lost is not None and not callable(on_lost):
            raise LockUsageError(f"on_lost must be callable, got {on_lost!r}")
        with self._lock:
            if self._closed:
                raise LockUsageError("this store is closed")
        session = Session(self, app_id, ttl_s, on_lost)
        with self._lock:
            self._sessions.add(session)
        self._heartbeat.add(session)
        self._leases.add(session)
        return session

    def set_permits(
        self,
        name: str,
        read: int | None = None,
        write: int = 1,
        *,
        force: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Cap how many may hold ``name`` at once in each mode; None: readers unlimited.

        Seen by the very next attempt of every client; waiters are woken to
        look again. Both caps change in one statement, never half-applied.

        Raising a cap while ``name`` is held in that mode would let a second holder
        in beside one that took the lock as the only one. So a raise waits for the
        current holders to leave: it queues for a write lock on ``name`` (in turn, like any
        waiter, seen in `waiters` as app "lockwarden-admin") and applies the new
        caps once granted — with the default write cap of 1 nobody else then holds
        ``name``. ``timeout`` bounds that wait (`LockTimeout`, caps unchanged);
        ``force=True`` applies at once (an administrator's override). A raise is
        logged (the ``lockwarden`` logger) and recorded (`admin_log`).
        """
        name = validate.name(name)
        read_n = validate.permits(read, "read", none=True)
        write_n = validate.permits(write, "write", none=False)
        assert write_n is not None  # none=False
        force = validate.flag(force, "force")
        wait = validate.timeout(timeout)
        before = self.permits(name)
        raised = {Mode.X} if write_n > before.write else set()
        if before.read is not None and (read_n is None or read_n > before.read):
            raised.add(Mode.S)
        # Only holders in a raised mode could find another beside them that their cap
        # kept out (readers and writers exclude each other whatever the caps).
        held = not force and any(not e.stale and e.mode in raised for e in self.locks(name))
        if held:
            with self.session(_ADMIN_APP, ttl=15.0) as admin:
                try:
                    drained = admin.lock(name, "write", timeout=wait)
                except LockTimeout as exc:
                    raise LockTimeout(
                        f"permits of {name!r} unchanged: {exc}. They apply once the current "
                        "holders leave; force=True applies them at once",
                        resource=name,
                        mode=Mode.X,
                        timeout=wait,
                        blockers=exc.blockers,
                    ) from None
                with drained:
                    self._backend.set_permits(name, read_n, write_n)
        else:
            self._backend.set_permits(name, read_n, write_n)
        if raised:
            how = "forced while held" if force else "after the holders left" if held else "not held"
            self._record(
                "set_permits",
                name,
                f"read {before.read} -> {read_n}, write {before.write} -> {write_n} ({how})",
            )

    def permits(self, name: str) -> Permits:
        """The caps `set_permits` gave ``name`` (the defaults if it never did)."""
        rows = self._backend.permits(validate.name(name))
        if not rows:
            return Permits(read=None, write=1)
        return Permits(read=rows[0]["read_permits"], write=rows[0]["write_permits"])

    def release_all(self, app_id: str, *, force: bool = False) -> int:
        """Release the locks and waits of ``app_id``'s sessions that are no longer alive,
        and expire them; returns how many locks went.

        For start-up after a crash (a restarting service clearing what its last
        run held). Sessions still alive — another process of the same app, on
        this host or another — are left alone unless ``force=True``, an
        administrator's override that takes their locks too (they learn it at
        their next heartbeat, by `LockLost`). Logged (the ``lockwarden`` logger)
        and recorded (`admin_log`) when it removes anything or is forced.
        """
        app_id = validate.name(app_id, "app_id")
        force = validate.flag(force, "force")
        holders = self._backend.release_app(app_id, force)
        if force or holders:
            self._record("release_all", app_id, f"locks released: {holders}{' (forced)' * force}")
        return holders

    def break_lock(self, name: str) -> int:
        """Remove every holder of ``name`` (an administrator's override); returns how many.

        Every later grant carries a larger token, so a fence turns away the
        broken holder's writes once the new holder has used its token. Logged
        and recorded (`admin_log`).
        """
        name = validate.name(name)
        removed = self._backend.break_lock(name)
        self._record("break_lock", name, f"{removed} holders removed")
        return removed

    def reset_fence(self, resource: str) -> int:
        """Forget a fence's tokens and value (an administrator's override); returns the highest
        token it had admitted (0 if none).

        For a fence shut by a token of another lock or a mistaken huge one: the
        next holder's token is admitted again. Logged and recorded (`admin_log`).
        """
        resource = validate.name(resource, "fence resource")
        highest = self._backend.fence_reset(resource)
        self._record("reset_fence", resource, f"forgot token {highest}")
        return highest

    def admin_log(self, limit: int = 50) -> list[AdminAction]:
        """The latest administrators' overrides, newest first: forced `release_all`,
        raised permits, broken locks, reset fences."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10**6:
            raise LockUsageError(
                f"limit must be an integer from 1 to 1000000, got {validate.shown(limit)}"
            )
        rows = self._backend.admin_log(limit)
        return [
            AdminAction(
                r["action"], r["subject"], r["detail"], r["host"], r["pid"], r["now"] - r["at"]
            )
            for r in rows
        ]

    def admin_counts(self) -> dict[str, int]:
        """How many overrides of each kind (`AdminAction.action`) the store has recorded,
        ever: the counters behind ``lockwarden_overrides_total`` in the metrics."""
        return self._backend.admin_counts()

    def reclaimed_count(self) -> int:
        """How many locks of dead holders acquirers have taken over, ever, across the store:
        the counter behind ``lockwarden_reclaimed_locks_total`` in the metrics.

        One per lock removed from a dead session by an acquirer (``on_stale="reclaim"``),
        counted in the transaction that removes it, whether that acquirer was then granted
        or still had to wait. Locks that `clean`, `break_lock` or `release_all` remove are
        not reclaims: nobody took them over (the last two are `admin_counts`).
        """
        return self._backend.reclaimed()

    def _record(self, action: str, subject: str, detail: str) -> None:
        """Log an administrator's override and keep it in the store (`admin_log`)."""
        hooks.logger(ADMIN_LOG).info("%s %r on %s: %s", action, subject, self.url, detail)
        self._backend.record_admin(
            id=random_hex(16),
            action=action,
            subject=subject,
            detail=detail,
            host=socket.gethostname(),
            pid=os.getpid(),
        )

    def clean(self) -> Cleaned:
        """Remove expired sessions with their locks and waits, and waits past their deadline."""
        sessions, holders, waiters = self._backend.clean()
        return Cleaned(sessions=sessions, locks=holders, waiters=waiters)

    def locks(self, name: str | None = None) -> list[LockEntry]:
        """Every granted lock (or those on ``name``), stale ones included and flagged."""
        rows = self._backend.locks(_optional_name(name))
        return [
            LockEntry(r["name"], Mode(r["mode"]), r["token"], holder_of(r), bool(r["stale"]))
            for r in rows
        ]

    def waiters(self, name: str | None = None) -> list[WaiterEntry]:
        """Every queued request (or those on ``name``), in queue order per name."""
        rows = self._backend.waiters(_optional_name(name))
        return [
            WaiterEntry(**r | {"mode": Mode(r["mode"]), "stale": bool(r["stale"])}) for r in rows
        ]

    def sessions(self) -> list[SessionEntry]:
        """Every session the store knows, live or not (expired ones until `clean` removes them)."""
        rows = self._backend.sessions()
        return [SessionEntry(**r | {"live": bool(r["live"])}) for r in rows]

    def waits_for(self) -> list[WaitEdge]:
        """The waits-for graph between live sessions, the one the deadlock check walks.

        A cycle in it is a deadlock that the next attempt of one of its
        sessions will break (design note, "Deadlocks across sessions").
        """
        rows = self._backend.waits_for()
        return [WaitEdge(r["src"], r["dst"], r["name"]) for r in rows]

    def fence(self, resource: str) -> Fence:
        """The fence of a protected resource, kept in this store's database."""
        return Fence(self._backend, resource)

    def close(self) -> None:
        """Close every open session (releasing its locks), stop the threads, close connections.

        In a forked child that has not used it, closing it only stops this
        process from using it; the parent's connections and locks are the
        parent's.
        """
        if self._inherited:
            self._closed = True
            return
        open_stores.STORES.discard(self)
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
            self._leases.close(wait=1.0)
            self._backend.close()

    def _forget(self, session: Session) -> None:
        self._heartbeat.remove(session)
        self._leases.remove(session)
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
