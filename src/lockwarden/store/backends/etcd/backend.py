"""The lock store on an etcd v3 cluster (its design note: README.md in this package).

The same algorithm as the SQL backends, on etcd's primitives: a session is a
lease, a holder or waiter row is a key, the fencing token is the revision
that created the holder key, and "one transaction" is an etcd transaction
guarded by comparisons of revisions instead of row locks. Each of the seam's
operations (`base.Backend`) is a method below; the docstrings of its helpers
name the shared SQL statement (`queries`) whose effect they have.

Keys (``P`` is the URL's prefix, ``N`` a lock name percent-encoded, so that
"/" only ever separates)::

    P/s/SESSION          session: app_id, host, pid, pid_start, ttl, lease  (on its lease)
    P/e/SESSION          rewritten each time a request of the session ends  (on its lease)
    P/h/N/REQUEST        holder: name, mode, session, who, when   (no lease: see "reclaim")
    P/o/SESSION/N/REQUEST  the same holder, found by session       (no lease)
    P/w/N/REQUEST        waiter: name, mode, names, session, lease, who, when, expires_at
                         (on the session's lease)
    P/p/N                permits of a name
    P/f/RESOURCE         fence: token, written, value
    P/q/N                written by a grant on release that leaves the name's other waiters
                         nothing to do: their stores do not wake them  (on the grantee's lease)
    P/g                  rewritten by every deadlock refusal (serializes them)
    P/r                  how many holder keys reclaims have deleted, ever
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, unquote

from lockwarden.errors import StoreError
from lockwarden.store.backends.base import AcquireRequest, Attempt, Backend, FoughtOver, Params, Row
from lockwarden.store.backends.etcd.cluster import (
    KV,
    Cluster,
    Op,
    Txn,
    Watch,
    absent,
    as_read,
    delete,
    exists,
    get,
    nested,
    put,
    scan,
    unchanged_since,
)
from lockwarden.store.url import StoreURL

Names = list[str | None]

_MAX_LEASE = 9_000_000_000
"""The longest lease etcd grants, in seconds."""

_BATCH = 128
"""Operations per clean-up transaction: etcd's default ``--max-txn-ops``."""

_GUARDED = 64
"""The most sessions a release's grant compares (a comparison each, within
``--max-txn-ops``): with more holders left on the name, the release grants nothing; with
more other waiters' sessions to check, its grant is not quiet."""


def _q(name: str) -> str:
    return quote(name, safe="")


def _now() -> float:
    """Wall-clock seconds, for ages shown and ``max_hold`` and waiter deadlines only:
    etcd has no clock of its own to offer, and liveness never reads this (it is the lease)."""
    return time.time()


class EtcdBackend(Backend):
    """One lock store under one key prefix of one etcd cluster."""

    def __init__(self, url: StoreURL) -> None:
        super().__init__(url)
        self._kv = Cluster(url, self.stats)
        self._p = url.schema + "/"
        self._leases: dict[str, int] = {}  # this process's sessions -> their lease ids
        self._late: dict[str, int] = {}
        """Sessions of this process that may have a grant or queue entry still on its way
        (README.md, "Writes that arrive late") -> the latest revision such a write was
        decided on; the end of a request voids them (`_end`)."""
        self._late_lock = threading.Lock()
        self._contended = FoughtOver()
        """Names whose release reads the queue first: for the others, the release is
        one transaction while nobody waits (`_hand_over`)."""
        self._watch_lock = threading.Lock()
        self._watcher: Watch | None = None
        self._quiet: tuple[str, int] | None = None
        """The name (as in its keys) and revision of the last quiet grant the watch saw
        (`_quiet_mark`): its deletions wake nobody. The watch thread's alone."""
        self._kv.read([get(self._p + "g")])  # a wrong endpoint or a dead cluster fails here

    # -- keys -------------------------------------------------------------------------

    def _session_key(self, session: str) -> str:
        return f"{self._p}s/{session}"

    def _ends_key(self, session: str) -> str:
        return f"{self._p}e/{session}"

    def _holder_key(self, name: str, request: str) -> str:
        return f"{self._p}h/{_q(name)}/{request}"

    def _owner_key(self, session: str, name: str, request: str) -> str:
        return f"{self._p}o/{session}/{_q(name)}/{request}"

    def _waiter_key(self, name: str, request: str) -> str:
        return f"{self._p}w/{_q(name)}/{request}"

    def _name_prefix(self, kind: str, name: str | None) -> str:
        return f"{self._p}{kind}/" + ("" if name is None else f"{_q(name)}/")

    # -- the Backend interface ----------------------------------------------------------

    # The seam's operations (`Backend`): each is one of the methods below, which take
    # the operation's arguments as a mapping; an operation that frees names wakes
    # their waiters here (`_woken`) and, through the watch, everywhere else.

    def open_session(
        self, *, session: str, app_id: str, host: str, pid: int, pid_start: str | None, ttl: float
    ) -> Row:
        params = {"session": session, "app_id": app_id, "host": host, "pid": pid}
        return self._open_session(params | {"pid_start": pid_start, "ttl": ttl})[0]

    def heartbeat(self, session: str) -> list[Row]:
        return self._heartbeat({"session": session})

    def check(self, session: str, request: str, names: Sequence[str]) -> Row:
        return self._check({"session": session, "request": request, "names": list(names)})[0]

    def close_session(self, session: str) -> None:
        self._woken(self._close_session({"session": session}))

    def expire_session(self, session: str) -> None:
        self._woken(self._expire_session({"session": session}))

    def locks(self, name: str | None) -> list[Row]:
        return self._locks({"name": name})

    def waiters(self, name: str | None) -> list[Row]:
        return self._waiters({"name": name})

    def sessions(self) -> list[Row]:
        return self._sessions({})

    def waits_for(self) -> list[Row]:
        return self._waits_for({})

    def permits(self, name: str) -> list[Row]:
        return self._permits({"name": name})

    def set_permits(self, name: str, read: int | None, write: int) -> None:
        self._woken(self._set_permits({"name": name, "read": read, "write": write}))

    def release_app(self, app_id: str, force: bool) -> int:
        params = {"app_id": app_id, "force": force}
        self._woken(self._expire_app(params))
        _, holders = self._woken(self._release_expired_of_app(params))
        return len(holders)

    def break_lock(self, name: str) -> int:
        return len(self._woken(self._break_lock({"name": name}))[0])

    def clean(self) -> tuple[int, int, int]:
        waiters, holders, sessions = self._woken(self._clean({}))
        return len(sessions), len(holders), len(waiters)

    def record_admin(
        self, *, id: str, action: str, subject: str, detail: str, host: str, pid: int
    ) -> None:
        params = {"id": id, "action": action, "subject": subject, "detail": detail}
        self._record_admin(params | {"host": host, "pid": pid})

    def admin_log(self, limit: int) -> list[Row]:
        return self._admin_log({"limit": limit})

    def admin_counts(self) -> dict[str, int]:
        return {r["action"]: int(r["n"]) for r in self._admin_counts({})}

    def reclaimed(self) -> int:
        rows = self._reclaimed({})
        return int(rows[0]["value"]) if rows else 0

    def fence_read(self, resource: str) -> list[Row]:
        return self._fence_read({"resource": resource})

    def fence_advance(
        self,
        *,
        resource: str,
        token: int,
        value: str | None,
        write: bool,
        session: str | None,
        request: str | None,
    ) -> list[Row]:
        params = {"resource": resource, "token": token, "value": value, "write": write}
        return self._fence_advance(params | {"session": session, "request": request})

    def fence_reset(self, resource: str) -> int:
        rows = self._fence_reset({"resource": resource})
        return int(rows[0]["token"]) if rows else 0

    def _woken(self, found: list[Names]) -> list[Names]:
        """``found`` (the names each step of a change freed), their waiters here woken."""
        self.wakeups.wake({name for names in found for name in names if name is not None})
        return found

    def _watch(self, timeout: float | None) -> None:
        with self._watch_lock:
            if self._watcher is None:
                self._watcher = self._kv.watch(self._p, self._on_event, self.wakeups.wake_all)
            watcher = self._watcher
        bound = self.url.call_timeout
        if timeout is not None and timeout < bound:  # the waiter's time runs out first
            watcher.wait_created(timeout)
        elif not watcher.wait_created(bound):
            raise StoreError(
                f"lock store {self.url.display}: could not open a watch within {bound:g} s"
                " (is a majority of the cluster up and reachable?)"
            )

    def _on_event(self, kind: str, key: str, created: int, revision: int) -> None:
        """Wake the local waiters a change may let in: a holder or waiter gone, permits
        changed; a session gone (its lease expired) may have left stale holders anywhere.
        A holder key written is a grant: its request, if it waits here, holds the lock
        with the key's creating revision as its token (a release's grant, `_hand_over`).
        A quiet mark comes first in its transaction: that transaction's deletions of the
        name's keys wake nobody (`_quiet_mark`)."""
        part = key[len(self._p) :].split("/")
        if part[0] == "q":
            if kind == "PUT":
                self._quiet = (part[1], revision)
        elif part[0] == "h" and kind == "PUT":
            self.wakeups.address(part[2], (created,))
        elif part[0] in ("h", "w") and kind == "DELETE":
            if self._quiet != (part[1], revision):
                self.wakeups.wake([unquote(part[1])])
        elif part[0] == "p":
            self.wakeups.wake([unquote(part[1])])
        elif part[0] == "s" and kind == "DELETE":
            self.wakeups.wake_all()

    def close(self) -> None:
        with self._watch_lock:
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.close()
        self._kv.close()

    # -- acquire (README.md, "Acquire") -----------------------------------------------------

    def acquire(self, request: AcquireRequest) -> Attempt:
        self.stats.add("attempts")
        reclaimed = False
        while True:  # each turn reads; a write whose guard failed means someone else moved
            state = self._kv.read(
                [
                    get(self._session_key(request.session_id)),
                    scan(f"{self._p}o/{request.session_id}/", limit=1),
                ]
                + [
                    op
                    for name in request.names
                    for op in (
                        scan(self._name_prefix("h", name)),
                        scan(self._name_prefix("w", name)),
                        get(f"{self._p}p/{_q(name)}"),
                    )
                ]
            )
            own = state.kvs(0)
            holds_any = bool(state.kvs(1))
            holders = {n: state.kvs(2 + 3 * i) for i, n in enumerate(request.names)}
            waiters = {n: state.kvs(3 + 3 * i) for i, n in enumerate(request.names)}
            permits = {n: state.kvs(4 + 3 * i) for i, n in enumerate(request.names)}
            granted = {
                n: kv.create
                for n in request.names
                for kv in holders[n]
                if kv.key.endswith("/" + request.request_id)
                and kv.value["session"] == request.session_id
            }
            if granted:  # a retry of an attempt that was granted
                return Attempt("granted", tokens=granted, reclaimed=reclaimed)
            if not own:
                return Attempt("lost")
            session = own[0].value
            mine = [
                kv.create for n in request.names for kv in waiters[n] if self._is_mine(kv, request)
            ]
            seq = min(mine) if mine else None
            live = self._live({kv.value["session"] for n in request.names for kv in holders[n]})
            now = _now()
            rows = [
                row
                for name, mode in zip(request.names, request.modes, strict=True)
                for row in _in_the_way(
                    name,
                    mode,
                    holders=holders[name],
                    waiters=waiters[name],
                    permits=permits[name],
                    seq=seq,
                    request_id=request.request_id,
                    refuse=request.refuse,
                    live=live,
                    now=now,
                )
            ]
            dead = [
                r for r in rows if r["kind"] == "holder" and not r["live"] and not request.refuse
            ]
            if dead:
                reclaimed = self._reclaim(dead) or reclaimed
                continue
            if len(request.names) == 1:
                self._contended.note(request.names, bool(rows))
            if not rows:
                done = self._grant(request, session, state.revision)
                if done.succeeded:
                    tokens = dict.fromkeys(request.names, done.revision)
                    return Attempt("granted", tokens=tokens, reclaimed=reclaimed)
                continue
            if not request.enqueue:
                if self._writes_on_their_way(request.session_id):  # void a copy of our grant
                    self._end(
                        request.session_id, request.request_id, request.names, session["lease"]
                    )
                return Attempt("blocked", reclaimed=reclaimed, rows=tuple(rows))
            if seq is None and not self._enqueue(request, session, state.revision):
                continue
            if holds_any:
                edges = self._deadlock(request, session)
                if edges is not None:
                    return Attempt("deadlock", edges=edges)
            return Attempt("blocked", reclaimed=reclaimed, rows=tuple(rows))

    def _is_mine(self, kv: KV, request: AcquireRequest) -> bool:
        return (
            kv.key.endswith("/" + request.request_id) and kv.value["session"] == request.session_id
        )

    def _live(self, sessions: Iterable[str]) -> set[str]:
        """Which of these sessions are live: their key (on their lease) still exists.

        Read after the state it judges, which is safe: a session never comes back
        to life, so one found live might have died since (the waiter is woken by
        the key's deletion), and one found dead was dead at the earlier read too.
        """
        wanted = sorted(sessions)
        if not wanted:
            return set()
        found = self._kv.read([get(self._session_key(s)) for s in wanted])
        return {s for i, s in enumerate(wanted) if found.kvs(i)}

    def _reclaim(self, dead: Sequence[Row]) -> bool:
        """Delete the holder keys of dead sessions (and their index keys), adding how many to
        the count at ``P/r`` in the same transaction; whether this call deleted any.

        Guarded by the sessions' keys being absent, which never changes once true
        (session ids are random and a session key is only ever written at open), by
        each holder key still existing (a dead session's holder key, once gone, never
        comes back), and by the count's revision as read. After each transaction the
        keys are read again, until none is left: one that another reclaim moved first
        is tried again, and batches stay within etcd's limit of operations. A
        transaction resent after its answer was lost fails its guards, so nothing is
        counted twice; one that then finds its keys gone counts as ours, as a release
        does (README.md, "Release, break, release_all, clean").
        """
        count = self._p + "r"
        by_key = {self._holder_key(r["name"], r["request_id"]): r for r in dead}
        keys = list(by_key)
        sessions = [absent(self._session_key(s)) for s in {r["session_id"] for r in dead}]
        took = resent = False
        while True:
            found = self._kv.read([get(count), *map(get, keys)])
            left = [key for i, key in enumerate(keys) if found.kvs(i + 1)][: (_BATCH - 1) // 2]
            if not left:
                return took or resent
            counted = found.kvs(0)
            ops = [put(count, (counted[0].value if counted else 0) + len(left))]
            for key in left:
                r = by_key[key]
                ops += [
                    delete(key),
                    delete(self._owner_key(r["session_id"], r["name"], r["request_id"])),
                ]
            guard = unchanged_since(count, counted[0].mod) if counted else absent(count)
            done = self._kv.txn(ops, [*sessions, *map(exists, left), guard])
            if done.succeeded:
                took = True
                self.wakeups.wake({by_key[key]["name"] for key in left})
            resent = resent or done.resent

    def _live_since(self, session_id: str, revision: int) -> list[Op]:
        """Guards that the session is live and has ended no request since ``revision``: a
        write sent before one of its requests ended fails if it arrives after (README.md,
        "Writes that arrive late")."""
        return [
            exists(self._session_key(session_id)),
            unchanged_since(self._ends_key(session_id), revision),
        ]

    def _grant(self, request: AcquireRequest, session: Mapping[str, Any], revision: int) -> Txn:
        """Write the holder keys if nothing changed in the way since ``revision``.

        The guard: our session's key still exists and it ended no request since,
        and no holder key of any of the names and no permits key was written after
        the state was read. Waiters that queued since are behind us. The token is
        the revision of this very write.
        """
        compare = self._live_since(request.session_id, revision)
        ops: list[Op] = []
        for name, mode in zip(request.names, request.modes, strict=True):
            compare += self._no_change_in_the_way(name, revision)
            ops += self._granting(name, mode, request.session_id, request.request_id, session)
        return self._send_guarded(request.session_id, revision, ops, compare)

    def _no_change_in_the_way(self, name: str, revision: int) -> list[Op]:
        """Guards that no holder key and no permits key of ``name`` was written after
        ``revision`` (a deletion passes: it only frees)."""
        return [
            unchanged_since(self._name_prefix("h", name), revision, under=True),
            unchanged_since(f"{self._p}p/{_q(name)}", revision),
        ]

    def _granting(
        self, name: str, mode: str, session_id: str, request_id: str, who: Mapping[str, Any]
    ) -> list[Op]:
        """The writes of one request's grant of ``name``: its holder key (with what ``who``,
        its session key or its waiter key, says of the session), its index key, and the
        deletion of its waiter key."""
        holder = {"name": name, "mode": mode, "session": session_id, "at": _now(), **_who(who)}
        return [
            put(self._holder_key(name, request_id), holder),
            put(self._owner_key(session_id, name, request_id), name),
            delete(self._waiter_key(name, request_id)),
        ]

    def _enqueue(self, request: AcquireRequest, session: Mapping[str, Any], revision: int) -> bool:
        """Queue the request on every name (one revision: its place in each queue); False if
        something changed since ``revision`` that calls for a new look: our session ended a
        request or was lost, or this request was granted (a copy of its grant arrived)."""
        now = _now()
        expires = None if request.wait is None else now + request.wait
        ops = [
            put(
                self._waiter_key(name, request.request_id),
                {
                    "name": name,
                    "mode": mode,
                    "names": len(request.names),
                    "session": request.session_id,
                    "lease": session["lease"],
                    "at": now,
                    "expires_at": expires,
                    **_who(session),
                },
                lease=session["lease"],
            )
            for name, mode in zip(request.names, request.modes, strict=True)
        ]
        compare = self._live_since(request.session_id, revision)
        compare += [absent(self._holder_key(name, request.request_id)) for name in request.names]
        return self._send_guarded(request.session_id, revision, ops, compare).succeeded

    def _send_guarded(
        self, session_id: str, revision: int, ops: Sequence[Op], compare: Sequence[Op]
    ) -> Txn:
        """Send a grant or a queue entry decided on the state read at ``revision``; if its
        answer was lost (it was sent again, or no answer came), remember that a copy may
        still arrive, so that the end of the session's next request voids it (`_end`)."""
        try:
            done = self._kv.txn(ops, compare)
        except BaseException:
            self._may_arrive(session_id, revision)
            raise
        if done.resent:
            self._may_arrive(session_id, revision)
        return done

    def _may_arrive(self, session_id: str, revision: int) -> None:
        with self._late_lock:
            self._late[session_id] = max(revision, self._late.get(session_id, revision))

    def _writes_on_their_way(self, session_id: str) -> bool:
        with self._late_lock:
            return session_id in self._late

    def _deadlock(
        self, request: AcquireRequest, session: Mapping[str, Any]
    ) -> tuple[tuple[str, str], ...] | None:
        """The waits-for edges reachable from our session if it is on a cycle (our queue
        entries are then removed), else None (design note, "Deadlocks across sessions").

        The request that closed the cycle is the one refused, as on the SQL
        backends: if the newest key on the cycle is another request's waiter key,
        that request closed it and refuses itself at its own check, which follows
        its enqueue (an older waiter that looks meanwhile, woken by the enqueue,
        leaves it be). If the newest is a holder key, a grant closed the cycle and
        the waiters it blocks refuse. A refusal rewrites ``P/g`` guarded by its
        revision as read: of two requests that refuse at once, the second's guard
        fails, it looks again, and finds the cycle gone with the first's queue entries.
        The refusal ends the request: it also removes a grant of it that arrived late,
        and voids any still to come (`_end`).
        """
        while True:
            found = self._kv.read(
                [
                    scan(self._p + "w/"),
                    scan(self._p + "h/"),
                    scan(self._p + "s/"),
                    scan(self._p + "p/"),
                    get(self._p + "g"),
                ]
            )
            live = {kv.key.rsplit("/", 1)[1] for kv in found.kvs(2)}
            caps = {kv.value["name"]: kv.value for kv in found.kvs(3)}
            keyed = _keyed_edges(found.kvs(0), found.kvs(1), live, caps, _now())
            edges = sorted({(e.src, e.dst) for e in keyed})
            reach = _reachable(request.session_id, edges)
            if request.session_id not in reach:
                return None
            holding = {kv.value["session"] for kv in found.kvs(1)}
            if _closed_by_another(request, keyed, edges, self._p + "w/", holding):
                return None
            graph = found.kvs(4)
            ops = [
                put(self._p + "g", found.revision),
                *self._request_keys_deleted(request.session_id, request.request_id, request.names),
                put(self._ends_key(request.session_id), "", lease=session["lease"]),
            ]
            guard = unchanged_since(self._p + "g", graph[0].mod if graph else 0)
            if self._kv.txn(ops, [guard, exists(self._session_key(request.session_id))]).succeeded:
                mine = {request.session_id} | reach
                return tuple((s, d) for s, d in edges if s in mine)

    # -- release ------------------------------------------------------------------------

    def release(self, session_id: str, request_id: str, names: Sequence[str]) -> int:
        quiet = False
        if len(names) == 1 and not self._writes_on_their_way(session_id):
            done, quiet = self._hand_over(session_id, request_id, names[0])
        else:
            done = self._end(session_id, request_id, names, lease=self._leases.get(session_id))
        deleted = sum(
            1
            for i in range(0, 3 * len(names), 3)
            for kv in done.deleted(i)
            if kv.value["session"] == session_id
        )
        if not quiet:
            self.wakeups.wake(names)
        if (
            done.resent and deleted == 0
        ):  # the first send did it (design note, "Connection failures")
            return len(names)
        return deleted

    def _hand_over(self, session_id: str, request_id: str, name: str) -> tuple[Txn, bool]:
        """Release one name and, in the same transaction, grant the first waiter the release
        lets in (README.md, "Grant on release").

        Nobody waiting, it is one transaction, conditional on the queue being empty;
        if it is not, that transaction reads the queue instead of releasing. A name
        this store has seen fought over is read first, without the conditional write.
        The grant is guarded by what it was decided on: no holder key or permits of
        the name written since, the other holders' sessions live, the grantee's
        waiter key as read (so its request has not ended, and a copy of this
        transaction that arrives late finds it gone) and its session live. If the
        guard fails, the release alone is done, and the waiters, woken by it, look.
        Also whether the grant was quiet: the name's other waiters need no wake-up.
        """
        ops = self._request_keys_deleted(session_id, request_id, [name])
        queue = [
            scan(self._name_prefix("w", name)),
            scan(self._name_prefix("h", name)),
            get(f"{self._p}p/{_q(name)}"),
        ]
        resent = False
        if name in self._contended:
            state = self._kv.read(queue)
        else:
            state = self._kv.txn(ops, [absent(self._name_prefix("w", name), under=True)], queue)
            if state.succeeded:
                return state, False
            resent = state.resent  # its first send may have released (and found no waiter)
        self._contended.note([name], bool(state.kvs(0)))
        grant, guard = self._let_in(name, request_id, state)
        quiet = False
        if not grant:
            done = self._kv.txn(ops)
        else:
            # The grant first: watchers see it before the deletions that wake the name's
            # waiters, so its waiter is handed the lock instead of attempting.
            done = self._kv.txn([*grant, *ops], guard, ops)
            if done.succeeded:  # what the release deleted, first, as in any other
                quiet = "request_txn" in grant[0] and done.took(0)
                done = replace(done, responses=done.responses[len(grant) :])
        return (replace(done, resent=True) if resent else done), quiet

    def _let_in(self, name: str, released: str, state: Txn) -> tuple[list[Op], list[Op]]:
        """The writes that grant the first waiter of ``name`` whom the release of request
        ``released`` (its holder key, or its waiter key: a waiter giving up) lets in, by the
        rules of an attempt (`_in_the_way`), and the guard they need; no writes if there is
        nobody to let in.

        One request per release: each grant's token is the revision of its own
        transaction, so tokens stay strictly increasing per name. Others that the
        release lets in too (readers behind a reader) are woken by it and take
        theirs. Only single-name requests are granted here (a multi-lock's other
        names are not read), but one in the queue still counts as a waiter ahead of
        those behind it. The holders left are taken as live, and the guard says so:
        a dead one is for the waiters to reclaim, under their own policy.
        """
        holders = [kv for kv in state.kvs(1) if kv.key != self._holder_key(name, released)]
        if len(holders) > _GUARDED:
            return [], []
        gone = self._waiter_key(name, released)
        waiters = sorted((kv for kv in state.kvs(0) if kv.key != gone), key=lambda kv: kv.create)
        now = _now()
        for kv in waiters:
            waiter = kv.value
            if waiter.get("names") != 1 or _expired(waiter, now):
                continue  # a multi-lock, or a waiter whose time is up, looks for itself
            request = kv.key.rsplit("/", 1)[1]
            in_the_way = _in_the_way(
                name,
                waiter["mode"],
                holders=holders,
                waiters=waiters,
                permits=state.kvs(2),
                seq=kv.create,
                request_id=request,
                refuse=False,
                live={h.value["session"] for h in holders},
                now=now,
            )
            if in_the_way:
                continue
            grant = [
                *self._quiet_mark(name, kv, waiters, state),
                *self._granting(name, waiter["mode"], waiter["session"], request, waiter),
            ]
            guard = [
                *self._no_change_in_the_way(name, state.revision),
                as_read(kv),
                exists(self._session_key(waiter["session"])),
                *(exists(self._session_key(s)) for s in {h.value["session"] for h in holders}),
            ]
            return grant, guard
        return [], []

    def _quiet_mark(self, name: str, granted: KV, waiters: Sequence[KV], state: Txn) -> list[Op]:
        """The quiet mark of a grant of ``name`` to the waiter ``granted``, as the first
        operation of its transaction, when the grant may leave the name's other waiters
        nothing to do (README.md, "Quiet hand-overs"); else nothing.

        The grant must be a write with a write cap of one: every other request for
        the name is then blocked by it. The mark is written only if, as the
        transaction begins, no waiter key of the name was written since the queue
        was read, and no session of those waiters holds a lock: a waiter of such a
        session may close a cycle through the new holder, and must look to run the
        deadlock check. Otherwise the grant goes ahead without the mark, and wakes.
        """
        waiter = granted.value
        others = {kv.value["session"] for kv in waiters if kv.key != granted.key}
        if (
            waiter["mode"] != "X"
            or _cap(state.kvs(2), "X") != 1
            or "lease" not in waiter
            or waiter["session"] in others
            or len(others) > _GUARDED
        ):
            return []
        compare = [
            unchanged_since(self._name_prefix("w", name), state.revision, under=True),
            *(absent(f"{self._p}o/{s}/", under=True) for s in sorted(others)),
        ]
        return [nested([put(f"{self._p}q/{_q(name)}", "", lease=waiter["lease"])], compare)]

    def _request_keys_deleted(
        self, session_id: str, request_id: str, names: Sequence[str]
    ) -> list[Op]:
        """Deletions of every key of one request: holder, waiter and index, name by name."""
        return [
            op
            for name in names
            for op in (
                delete(self._holder_key(name, request_id)),
                delete(self._waiter_key(name, request_id)),
                delete(self._owner_key(session_id, name, request_id)),
            )
        ]

    def _end(
        self, session_id: str, request_id: str, names: Sequence[str], lease: int | None
    ) -> Txn:
        """End a request: delete its keys, and, if a grant or queue entry of its session may
        still be on its way (`_send_guarded`), rewrite the session's ends key (on lease
        ``lease``; None: a session of another process, or closed) while the session lives,
        so that such a write fails its guard when it arrives (README.md, "Writes that arrive
        late"). One transaction: a copy applied before it is deleted, one applied after
        fails. Without a write on its way, nothing can arrive late: only the deletions."""
        ops = self._request_keys_deleted(session_id, request_id, names)
        if lease is None or not self._writes_on_their_way(session_id):
            return self._kv.txn(ops)
        mark = put(self._ends_key(session_id), "", lease=lease)
        done = self._kv.txn([*ops, mark], [exists(self._session_key(session_id))], ops)
        with self._late_lock:  # writes decided on an earlier revision are void now
            if not done.succeeded or self._late.get(session_id, done.revision) < done.revision:
                self._late.pop(session_id, None)
        return done

    # -- sessions -------------------------------------------------------------------------

    def _open_session(self, p: Params) -> list[Row]:
        # Leases count whole seconds: rounding up keeps the cluster's view of the
        # session at least as long as the client's (which gives up first).
        # etcd grants at most 9e9 s (its MaxLeaseTTL); longer TTLs are clamped to that.
        seconds = min(_MAX_LEASE, max(1, math.ceil(float(p["ttl"]))))  # type: ignore[arg-type]
        lease = self._kv.grant(seconds)
        value = {
            "app_id": p["app_id"],
            "host": p["host"],
            "pid": p["pid"],
            "pid_start": p["pid_start"],
            "ttl": p["ttl"],
            "lease": lease,
            "at": _now(),
        }
        self._kv.txn([put(self._session_key(str(p["session"])), value, lease=lease)])
        self._leases[str(p["session"])] = lease
        return [{"started": 0}]

    def _heartbeat(self, p: Params) -> list[Row]:
        session = str(p["session"])
        lease = self._leases.get(session)
        if lease is None or not self._kv.keep_alive(lease, self._session_key(session)):
            return []
        return [{"started": 0}]

    def _session_holders(self, session: str) -> list[tuple[str, str]]:
        """(name, request id) of every holder key of a session, from its index keys."""
        found = self._kv.read([scan(f"{self._p}o/{session}/")]).kvs(0)
        return [(kv.value, kv.key.rsplit("/", 1)[1]) for kv in found]

    def _drop_holders(self, held: Iterable[tuple[str, str, str]]) -> list[str | None]:
        """Delete holder keys given as (session, name, request); return the names removed.

        In batches that fit etcd's default limit of operations per transaction:
        deletions only ever free locks, so a crash between batches leaves nothing
        wrong, only something for the next release, reclaim or `clean` to finish.
        """
        ops = [
            op
            for session, name, request in held
            for op in (
                delete(self._holder_key(name, request)),
                delete(self._owner_key(session, name, request)),
            )
        ]
        names: list[str | None] = []
        for start in range(0, len(ops), _BATCH):
            done = self._kv.txn(ops[start : start + _BATCH])
            names += [
                kv.value["name"] for i in range(0, len(done.responses), 2) for kv in done.deleted(i)
            ]
        return names

    def _close_session(self, p: Params) -> list[Names]:
        """End the session, then delete its holder keys (README.md, "Release, break, …").

        The lease goes first: a grant to one of the session's requests (a thread still
        waiting as the session closes) is guarded by the session key, so it either
        committed before the revoke, and its holder key is found below, or fails.
        """
        session = str(p["session"])
        lease = self._leases.pop(session, None)
        with self._late_lock:
            self._late.pop(session, None)
        if lease is not None:
            self._kv.revoke(lease)  # its session key and queue entries go with it
        names = self._drop_holders((session, n, r) for n, r in self._session_holders(session))
        return [[], names, [None]]

    def _expire_session(self, p: Params) -> list[Names]:
        session = str(p["session"])
        lease = self._leases.get(session)
        if lease is None:  # another process's session, whose process is gone (`process.gone`)
            found = self._kv.read([get(self._session_key(session))]).kvs(0)
            lease = found[0].value["lease"] if found else None
        if lease is not None:
            self._kv.revoke(lease)
        return [[None], [n for n, _ in self._session_holders(session)]]

    def _expire_app(self, p: Params) -> list[Names]:
        """`queries.EXPIRE_APP`: a session no longer alive has already lost its lease (and
        its key); with ``force``, the app's live sessions lose theirs now."""
        if not p["force"]:
            return [[]]
        found = self._kv.read([scan(self._p + "s/")]).kvs(0)
        sessions = [kv for kv in found if kv.value["app_id"] == p["app_id"]]
        for kv in sessions:
            self._kv.revoke(kv.value["lease"])
        return [[None] * len(sessions)]

    def _release_expired_of_app(self, p: Params) -> list[Names]:
        """`queries.RELEASE_EXPIRED_OF_APP`: the app's holders whose session key is gone."""
        found = self._kv.read([scan(self._p + "s/"), scan(self._p + "h/")])
        live = {kv.key.rsplit("/", 1)[1] for kv in found.kvs(0)}
        names = self._drop_holders(
            (kv.value["session"], kv.value["name"], kv.key.rsplit("/", 1)[1])
            for kv in found.kvs(1)
            if kv.value["app_id"] == p["app_id"] and kv.value["session"] not in live
        )
        return [[], names]

    def _break_lock(self, p: Params) -> list[Names]:
        found = self._kv.read([scan(self._name_prefix("h", str(p["name"])))]).kvs(0)
        return [
            self._drop_holders(
                (kv.value["session"], kv.value["name"], kv.key.rsplit("/", 1)[1]) for kv in found
            )
        ]

    def _clean(self, p: Params) -> list[Names]:
        found = self._kv.read([scan(self._p + "s/"), scan(self._p + "h/"), scan(self._p + "w/")])
        live = {kv.key.rsplit("/", 1)[1] for kv in found.kvs(0)}
        dead = [kv for kv in found.kvs(1) if kv.value["session"] not in live]
        holders = self._drop_holders(
            (kv.value["session"], kv.value["name"], kv.key.rsplit("/", 1)[1]) for kv in dead
        )
        now = _now()
        late = [kv for kv in found.kvs(2) if _expired(kv.value, now)]
        waiters: list[str | None] = []
        for start in range(0, len(late), _BATCH):
            done = self._kv.txn([delete(kv.key) for kv in late[start : start + _BATCH]])
            waiters += [
                kv.value["name"] for i in range(len(done.responses)) for kv in done.deleted(i)
            ]
        # A dead session's own key went with its lease; what is left of it is its holders.
        return [waiters, holders, [None] * len({kv.value["session"] for kv in dead})]

    # -- permits, reads, fences ---------------------------------------------------------

    def _set_permits(self, p: Params) -> list[Names]:
        """Set (or, to the defaults, delete) a name's permits key, as a compare-and-swap on
        it: a copy of an earlier change that arrives late finds the key changed since and
        fails, instead of bringing back caps an administrator had changed since (README.md,
        "Writes that arrive late")."""
        name = str(p["name"])
        key = f"{self._p}p/{_q(name)}"
        default = (p["read"], p["write"]) == (None, 1)
        caps = {"name": name, "read": p["read"], "write": p["write"]}
        change = delete(key) if default else put(key, caps)
        while True:
            found = self._kv.read([get(key)]).kvs(0)
            guard = unchanged_since(key, found[0].mod) if found else absent(key)
            if self._kv.txn([change], [guard]).succeeded:
                return [[name]]

    def _permits(self, p: Params) -> list[Row]:
        found = self._kv.read([get(f"{self._p}p/{_q(str(p['name']))}")]).kvs(0)
        return [
            {"read_permits": kv.value["read"], "write_permits": kv.value["write"]} for kv in found
        ]

    def _check(self, p: Params) -> list[Row]:
        names: Sequence[str] = p["names"]  # type: ignore[assignment]
        request = str(p["request"])
        found = self._kv.read(
            [get(self._session_key(str(p["session"])))]
            + [get(self._holder_key(n, request)) for n in names]
        )
        held = sum(
            1
            for i in range(len(names))
            for kv in found.kvs(i + 1)
            if kv.value["session"] == p["session"]
        )
        return [{"live": bool(found.kvs(0)), "held": held}]

    def _locks(self, p: Params) -> list[Row]:
        name = p["name"]
        found = self._kv.read(
            [
                scan(self._name_prefix("h", None if name is None else str(name))),
                scan(self._p + "s/"),
            ]
        )
        live = {kv.key.rsplit("/", 1)[1] for kv in found.kvs(1)}
        now = _now()
        rows = [
            {
                "name": kv.value["name"],
                "mode": kv.value["mode"],
                "token": kv.create,
                "session_id": kv.value["session"],
                "app_id": kv.value["app_id"],
                "host": kv.value["host"],
                "pid": kv.value["pid"],
                "since": kv.value["at"],
                "heartbeat_at": now,  # etcd does not say when a lease was last renewed
                "now": now,
                "stale": kv.value["session"] not in live,
            }
            for kv in found.kvs(0)
        ]
        return sorted(rows, key=lambda r: (r["name"], r["token"]))

    def _waiters(self, p: Params) -> list[Row]:
        name = p["name"]
        found = self._kv.read(
            [scan(self._name_prefix("w", None if name is None else str(name)))]
        ).kvs(0)
        now = _now()
        rows = [
            (
                kv.value["name"],
                kv.create,
                {
                    "name": kv.value["name"],
                    "mode": kv.value["mode"],
                    "session_id": kv.value["session"],
                    "app_id": kv.value["app_id"],
                    "host": kv.value["host"],
                    "pid": kv.value["pid"],
                    "waited_for": now - kv.value["at"],
                    "expires_in": None
                    if kv.value["expires_at"] is None
                    else kv.value["expires_at"] - now,
                    "stale": _expired(kv.value, now),
                },
            )
            for kv in found
        ]
        return [row for _, _, row in sorted(rows, key=lambda r: (r[0], r[1]))]

    def _sessions(self, p: Params) -> list[Row]:
        """Sessions whose lease lives: an expired lease takes its session key with it,
        so every session listed is live (and its heartbeat age unknown, as in `_locks`)."""
        now = _now()
        rows = [
            {
                "session_id": kv.key.rsplit("/", 1)[1],
                "app_id": kv.value["app_id"],
                "host": kv.value["host"],
                "pid": kv.value["pid"],
                "ttl": kv.value["ttl"],
                "age": now - kv.value["at"],
                "heartbeat_age": 0.0,
                "live": True,
            }
            for kv in self._kv.read([scan(self._p + "s/")]).kvs(0)
        ]
        return sorted(rows, key=lambda r: (-r["age"], r["session_id"]))

    def _waits_for(self, p: Params) -> list[Row]:
        found = self._kv.read(
            [scan(self._p + "w/"), scan(self._p + "h/"), scan(self._p + "s/"), scan(self._p + "p/")]
        )
        live = {kv.key.rsplit("/", 1)[1] for kv in found.kvs(2)}
        caps = {kv.value["name"]: kv.value for kv in found.kvs(3)}
        keyed = _keyed_edges(found.kvs(0), found.kvs(1), live, caps, _now())
        edges = {(e.src, e.dst, e.name) for e in keyed}
        return [{"src": src, "dst": dst, "name": name} for src, dst, name in sorted(edges)]

    def _fence_read(self, p: Params) -> list[Row]:
        found = self._kv.read([get(f"{self._p}f/{_q(str(p['resource']))}")]).kvs(0)
        return [dict(kv.value) for kv in found]

    def _fence_advance(self, p: Params) -> list[Row]:
        """`queries.FENCE_ADVANCE` as a compare-and-swap on the fence's key.

        A compare-and-swap whose answer was lost (a partition, a member killed)
        is sent again, and may have been applied meanwhile: the key then moved
        on, by this very write or by newer holders after it. A refusal found
        after that is no refusal anyone can trust, so the outcome is reported
        unknown (`StoreError`), as it is on the other backends when a call's
        answer is lost."""
        key = f"{self._p}f/{_q(str(p['resource']))}"
        token = int(p["token"])  # type: ignore[call-overload]
        resent = False
        while True:
            held: list[Op] = []
            if p.get("request") is not None:  # the access carries its lock: still held?
                found_held = self._held(str(p["session"]), str(p["request"]), token)
                if found_held is None:
                    return self._refused(resent)
                held = found_held
            found = self._kv.read([get(key)]).kvs(0)
            old = found[0].value if found else {"token": 0, "written": 0, "value": None}
            if (old["token"] if p["write"] else old["written"]) > token:
                return self._refused(resent)
            new = {
                "token": max(old["token"], token),
                "written": token if p["write"] else old["written"],
                "value": p["value"] if p["write"] else old["value"],
            }
            guard = unchanged_since(key, found[0].mod) if found else absent(key)
            done = self._kv.txn([put(key, new)], [guard, *held])
            if done.succeeded:
                return [new]
            resent = resent or done.resent

    def _refused(self, resent: bool) -> list[Row]:
        """A fence's refusal, unless an earlier sending of the access may have been applied."""
        if resent:
            raise StoreError(
                f"lock store {self.url.display}: the outcome of a fence access is unknown: "
                "its answer was lost and an earlier sending may have been applied"
            )
        return []

    def _held(self, session: str, request: str, token: int) -> list[Op] | None:
        """Guards that ``session``'s lock of ``request`` with ``token`` is still held (its
        holder key unchanged, its session's key there), or None if it is not."""
        owned = self._kv.read([scan(f"{self._p}o/{session}/")]).kvs(0)
        for kv in owned:
            if kv.key.rsplit("/", 1)[1] != request:
                continue
            key = self._holder_key(kv.value, request)
            found = self._kv.read([get(key), get(self._session_key(session))])
            holder = found.kvs(0)
            if holder and found.kvs(1) and holder[0].create == token:
                return [unchanged_since(key, holder[0].mod), exists(self._session_key(session))]
        return None

    def _fence_reset(self, p: Params) -> list[Row]:
        """`queries.FENCE_RESET`: the fence's key goes; its highest token comes back.

        Guarded by the key as read: a copy that arrives late, after holders wrote
        through the fence again, must not forget their tokens (which would admit an
        older holder's write; README.md, "Writes that arrive late"). A copy resent after
        its answer was lost finds the key gone: the first copy did it."""
        key = f"{self._p}f/{_q(str(p['resource']))}"
        ours: list[Row] = []
        while True:
            found = self._kv.read([get(key)]).kvs(0)
            if not found:
                return ours
            guard = [unchanged_since(key, found[0].mod), exists(key)]
            done = self._kv.txn([delete(key)], guard)
            ours = [{"token": found[0].value["token"]}]
            if done.succeeded:
                return ours
            if not done.resent:
                ours = []

    def _record_admin(self, p: Params) -> list[Row]:
        """`queries.RECORD_ADMIN`: a key of its own, with no lease (it outlives the session)."""
        record = {k: p[k] for k in ("action", "subject", "detail", "host", "pid")}
        self._kv.txn([put(f"{self._p}a/{p['id']}", {**record, "at": _now()})])
        return []

    def _admin_log(self, p: Params) -> list[Row]:
        """`queries.ADMIN_LOG`: the records, newest first."""
        records = sorted(
            (kv.value for kv in self._kv.read([scan(self._p + "a/")]).kvs(0)),
            key=lambda r: r["at"],
            reverse=True,
        )
        now = _now()
        return [{**r, "now": now} for r in records[: int(p["limit"])]]  # type: ignore[call-overload]

    def _reclaimed(self, p: Params) -> list[Row]:
        """`queries.RECLAIMED`: the count `_reclaim` keeps (no key: nothing reclaimed yet)."""
        found = self._kv.read([get(self._p + "r")]).kvs(0)
        return [{"value": kv.value} for kv in found]

    def _admin_counts(self, p: Params) -> list[Row]:
        """`queries.ADMIN_COUNTS`: the records counted by action."""
        counts = Counter(kv.value["action"] for kv in self._kv.read([scan(self._p + "a/")]).kvs(0))
        return [{"action": action, "n": n} for action, n in counts.items()]


def _who(session: Mapping[str, Any]) -> dict[str, Any]:
    """What a holder or waiter key repeats of its session, to be shown after the session
    (and its key) is gone."""
    return {k: session.get(k) for k in ("app_id", "host", "pid", "pid_start", "ttl")}


def _expired(waiter: Mapping[str, Any], now: float) -> bool:
    return waiter["expires_at"] is not None and waiter["expires_at"] <= now


def _in_the_way(
    name: str,
    mode: str,
    *,
    holders: Sequence[KV],
    waiters: Sequence[KV],
    permits: Sequence[KV],
    seq: int | None,
    request_id: str,
    refuse: bool,
    live: set[str],
    now: float,
) -> list[Row]:
    """`queries.IN_THE_WAY` over the keys read: the same rows, by the same rules."""
    others: list[Row] = []
    for kv in holders:
        alive = kv.value["session"] in live
        others.append(_row(name, "holder", kv, now, live=alive, expires_at=None))
    for kv in waiters:
        if kv.key.endswith("/" + request_id) or (seq is not None and kv.create >= seq):
            continue
        # a waiter key exists only while its session's lease does
        others.append(
            _row(
                name,
                "waiter",
                kv,
                now,
                live=not _expired(kv.value, now),
                expires_at=kv.value["expires_at"],
            )
        )
    counted = [o for o in others if o["live"] or (o["kind"] == "holder" and refuse)]
    cap = _cap(permits, mode)
    at_cap = cap is not None and sum(o["mode"] == mode for o in counted) >= cap
    return [
        o
        for o in others
        if (o["kind"] == "holder" and not o["live"] and not refuse)
        or (o in counted and (o["mode"] != mode or at_cap))
    ]


def _cap(permits: Sequence[KV], mode: str) -> int | None:
    """How many may hold a name in ``mode`` at once, by its permits key as read (None: any
    number; by default one writer, and readers without limit)."""
    if permits:
        cap: int | None = permits[0].value["write" if mode == "X" else "read"]
        return cap
    return 1 if mode == "X" else None


def _row(name: str, kind: str, kv: KV, now: float, *, live: bool, expires_at: float | None) -> Row:
    v = kv.value
    return {
        "name": name,
        "kind": kind,
        "mode": v["mode"],
        "since": v["at"],
        "expires_at": expires_at,
        "session_id": v["session"],
        "request_id": kv.key.rsplit("/", 1)[1],
        "app_id": v["app_id"],
        "host": v["host"],
        "pid": v["pid"],
        "pid_start": v.get("pid_start"),
        "heartbeat_at": now,  # look again a TTL from now if nobody wakes us
        "ttl": v["ttl"],
        "expired": not live,
        "live": live,
        "now": now,
    }


@dataclass(frozen=True, order=True)
class _Edge:
    """One waits-for edge, with the keys that make it: the waiter's and the blocker's."""

    src: str
    dst: str
    name: str
    waiter: KV = field(compare=False)
    blocker: KV = field(compare=False)


def _keyed_edges(
    waiters: Sequence[KV],
    holders: Sequence[KV],
    live: set[str],
    caps: Mapping[str, Any],
    now: float,
) -> list[_Edge]:
    """`queries.WAITS_FOR`' edge rule over the keys read: who waits for whom, on what."""
    waiting = [(kv, kv.create) for kv in waiters if not _expired(kv.value, now)]
    names = {kv.value["name"] for kv, _ in waiting}
    nodes = waiting + [  # a holder is ahead of every waiter
        (kv, -1) for kv in holders if kv.value["session"] in live and kv.value["name"] in names
    ]
    edges: list[_Edge] = []
    for wkv, seq in waiting:
        w = wkv.value
        cap = caps.get(w["name"])
        one = (cap["write"] if cap else 1) if w["mode"] == "X" else (cap["read"] if cap else None)
        for xkv, xseq in nodes:
            x = xkv.value
            same_name = x["name"] == w["name"] and x["session"] != w["session"]
            if same_name and xseq < seq and (x["mode"] != w["mode"] or one == 1):
                edges.append(_Edge(w["session"], x["session"], w["name"], wkv, xkv))
    return sorted(edges)


def _closed_by_another(
    request: AcquireRequest,
    keyed: Sequence[_Edge],
    edges: Sequence[tuple[str, str]],
    waiter_prefix: str,
    holding: set[str],
) -> bool:
    """Whether the newest key on our session's cycles is the waiter key of another request
    whose session holds locks: that request closed the cycle, and its own check (which
    only sessions holding locks run) refuses it (`_deadlock`)."""
    us = request.session_id
    on_cycle = {s for s in _reachable(us, edges) if us in _reachable(s, edges)} | {us}
    keys = [
        kv for e in keyed if e.src in on_cycle and e.dst in on_cycle for kv in (e.waiter, e.blocker)
    ]
    newest = max(keys, key=lambda kv: kv.create)
    return (
        newest.key.startswith(waiter_prefix)
        and not newest.key.endswith("/" + request.request_id)
        and newest.value["session"] in holding
    )


def _reachable(start: str, edges: Sequence[tuple[str, str]]) -> set[str]:
    after: dict[str, list[str]] = {}
    for src, dst in edges:
        after.setdefault(src, []).append(dst)
    seen: set[str] = set()
    todo = list(after.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(after.get(node, ()))
    return seen
