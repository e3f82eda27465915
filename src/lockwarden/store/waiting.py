"""The waiting loop of a lock request, written once for threads and for asyncio.

`acquire_steps` is a generator that decides; it does no I/O itself. It
yields what it needs done — a database call (`Call`), a subscription to
wake-ups (`Listen`) or a wait (`Wait`) — and a driver does it: `run_sync` in
the caller's thread, `aio.run_async` on an event loop. The loop (design
note, "Waiting and wake-ups"):

    attempt (enqueued) -> granted? done
                       -> blocked: subscribe (once), then wait for a grant, a wake-up,
                          the moment a blocker may turn stale or too old, or the
                          deadline -> granted by a release? done; else attempt again

`acquire` is the threaded entry: its first attempt is a plain call, and
nothing for waiting (generator, subscription, event) exists unless that
attempt is blocked. Giving up (a timeout, an error, a cancelled task) is one
release call, whatever happened before: it deletes what this request left,
queued *or granted* (a release may have granted it meanwhile), and passes
the lock on.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from functools import partial
from typing import Any, Generic, NamedTuple, TypeVar

from lockwarden import hooks
from lockwarden.errors import (
    Deadlock,
    HeldTooLong,
    Holder,
    HolderUnresponsive,
    LockLost,
    LockTimeout,
    StoreError,
)
from lockwarden.modes import Mode
from lockwarden.store import process
from lockwarden.store.backends.base import AcquireRequest, Attempt, Backend, Row
from lockwarden.store.inbox import MailboxSubscription
from lockwarden.store.status import holder_of
from lockwarden.store.validate import MAX_WAIT
from lockwarden.store.wakeups import Subscription, Wakeups, Woken

T = TypeVar("T")

PID_POLL = 0.25
"""Seconds between looks at a holder of another process on this machine (`process.gone`)."""

_PAST_THE_EDGE = 0.005
"""Look again this long after a blocker's deadline, so that it has certainly passed."""


class Call(NamedTuple):
    """Run a (blocking) database call and send its result back."""

    fn: Callable[[], Any]


class Listen(NamedTuple):
    """Subscribe to the wake-ups of ``names`` and of ``request_id`` (`Wakeups.add`)."""

    names: frozenset[str]
    request_id: str
    since: float
    """When the first attempt began (`time.monotonic`): wake-ups since then are delivered."""
    epoch: int
    """`Wakeups.epoch` before the first attempt."""
    timeout: float | None
    """The request's time left (None: no limit): the longest to wait for the backend's
    wake-ups to be in force (`Backend._watch`)."""


class Wait(NamedTuple):
    """Wait up to ``seconds`` (None: without limit); a wake-up ends it early if ``woken``.

    Sends back what ended it (`Woken`): the tokens of a grant made to the request
    meanwhile, True for another wake-up, False if the time ran out.
    """

    seconds: float | None
    woken: bool = True


Step = Call | Listen | Wait
Steps = Generator[Step, Any, T]
Grant = tuple[str, Mapping[str, int]]
"""A request id and the token of each name."""


class Driver(Generic[T]):
    """The generator side of a driver: hands out steps, takes back their outcomes.

    A step's exception (a timeout, a cancellation) is thrown into the
    generator, which cleans up and re-raises it.
    """

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self._value: Any = None
        self._error: BaseException | None = None
        self.result: T

    def next_step(self) -> Step | None:
        """The next step to run, or None when the generator has returned `result`."""
        try:
            if self._error is None:
                step = self._steps.send(self._value)
            else:
                step = self._steps.throw(self._error)
        except StopIteration as stop:
            self.result = stop.value
            return None
        self._value = self._error = None
        return step

    def outcome(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error


def run_sync(steps: Steps[T], wakeups: Wakeups, *, pokes: bool = False) -> T:
    """Drive ``steps`` in this thread; if releases may poke its waiters (``pokes``,
    `Backend.pokes`), with a mailbox of its own while it waits."""
    driver = Driver(steps)
    subscribe = MailboxSubscription.open if pokes else Subscription
    sub: Subscription | None = None
    try:
        while (step := driver.next_step()) is not None:
            try:
                if isinstance(step, Call):
                    driver.outcome(step.fn())
                elif isinstance(step, Listen):
                    sub = subscribe(step.names, step.request_id)
                    wakeups.add(sub, step.since, step.epoch, step.timeout)
                elif step.woken and sub is not None:
                    driver.outcome(sub.wait(step.seconds))
                else:
                    time.sleep(step.seconds or 0.0)
            except BaseException as exc:
                driver.outcome(error=exc)
    finally:
        if sub is not None:
            wakeups.remove(sub)
            sub.close()
    return driver.result


class Want(NamedTuple):
    """A lock request as the waiting loop needs it."""

    session_id: str
    request_id: str
    """Chosen by the session before the first attempt and kept across attempts, so that
    whatever cuts the call short, the session knows which request to give back."""
    items: tuple[tuple[str, Mode], ...]
    timeout: float | None
    refuse: bool
    max_hold: float | None
    lock_delay: float
    lost: Callable[[], LockLost]
    """Marks the session lost (the database says it is not live); returns the error to raise."""
    abandon: Callable[[str, Sequence[str], bool], object]
    """Removes what a request id left (waiter rows, a grant it never learned of); a failure
    is retried in the background (`Session._retry_release`); with ``later`` true, only in
    the background."""


def acquire(backend: Backend, want: Want) -> Grant:
    """Acquire ``want.items`` all or nothing, in this thread.

    The first attempt is a plain call; only if it is blocked (or needs a
    lock delay, or failed) does the waiting loop take over from it.
    """
    request_id = want.request_id
    epoch, since = backend.wakeups.epoch, time.monotonic()
    names = tuple(name for name, _ in want.items)
    try:
        first = backend.acquire(
            AcquireRequest(
                want.session_id,
                request_id,
                names,
                tuple(mode.value for _, mode in want.items),
                want.timeout != 0,
                want.refuse,
                want.timeout,
            )
        )
    except BaseException as exc:  # even a failed call may have committed
        give_back(want, exc)
        raise
    whole = len(first.tokens) == len(names)  # else partly taken back: `_granted` decides
    if first.status == "granted" and whole and not (first.reclaimed and want.lock_delay):
        _report_reclaim(first, names)
        return request_id, first.tokens
    steps = acquire_steps(backend, want, first=first, since=since, epoch=epoch)
    return run_sync(steps, backend.wakeups, pokes=backend.pokes)


def _report_reclaim(granted: Attempt, names: Sequence[str]) -> None:
    """Tell `lockwarden.hooks` if a grant took over from a dead holder."""
    if granted.reclaimed and hooks.active():
        for name in names:
            hooks.emit("reclaimed", name)


def acquire_steps(
    backend: Backend,
    want: Want,
    *,
    first: Attempt | None = None,
    since: float | None = None,
    epoch: int | None = None,
) -> Steps[Grant]:
    """Acquire ``want.items`` all or nothing; return the request id and each name's token.

    ``first``: the outcome of a first attempt already made (by `acquire`),
    when it began (``since``) and the `Wakeups.epoch` read before it.
    """
    request_id = want.request_id
    epoch = backend.wakeups.epoch if epoch is None else epoch
    since = time.monotonic() if since is None else since
    names = tuple(name for name, _ in want.items)
    modes = tuple(mode.value for _, mode in want.items)
    enqueue = want.timeout != 0
    deadline = None if want.timeout is None else since + want.timeout
    attempt = first
    queued = listening = False
    try:
        while True:
            left_rows = True  # until we know better: even a failed call may have committed
            if attempt is None:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                request = AcquireRequest(
                    want.session_id,
                    request_id,
                    names,
                    modes,
                    enqueue,
                    want.refuse,
                    remaining,
                    queued,
                )
                attempt = yield Call(partial(backend.acquire, request))
            if attempt.status == "granted":
                tokens = yield from _granted(want, attempt)
                return request_id, tokens
            if attempt.status == "lost":
                left_rows = queued  # this attempt changed nothing; an earlier one may have queued
                raise want.lost()
            if attempt.status == "deadlock":
                left_rows = False  # the attempt removed its own queue entries
                raise _deadlock(want, attempt)
            left_rows = queued = enqueue
            until = yield from _until(backend, want, attempt, deadline)
            if until is None:
                attempt = None  # look again
                continue
            remaining, look_again = until
            if not listening:
                listening = True
                yield Listen(frozenset(names), request_id, since, epoch, remaining)
                if deadline is not None:  # the wake-ups may have taken some of it
                    remaining = max(0.0, deadline - time.monotonic())
            woken = yield from _wait(backend, want, attempt.rows or (), _min(remaining, look_again))
            if isinstance(woken, tuple) and len(woken) == len(names):
                backend.stats.add("handed")  # granted by a release: no attempt needed
                return request_id, dict(zip(names, woken, strict=True))
            if attempt.rows is None and not woken:
                attempt = yield Call(partial(_look, backend, want, attempt))
            else:
                attempt = None
    except GeneratorExit:
        raise
    except BaseException as exc:
        if left_rows:
            yield Call(partial(give_back, want, exc))
        raise


def _granted(want: Want, attempt: Attempt) -> Steps[Mapping[str, int]]:
    """The tokens of a granted attempt, after the lock delay of a reclaim; `LockLost` if
    the grant is no longer whole (and the caller gives back what is left)."""
    if len(attempt.tokens) < len(want.items):
        raise _taken_back(want, attempt)
    _report_reclaim(attempt, [name for name, _ in want.items])
    if attempt.reclaimed and want.lock_delay:
        yield Wait(want.lock_delay, woken=False)
    return attempt.tokens


def _taken_back(want: Want, attempt: Attempt) -> LockLost:
    """A multi-lock granted by a release, then partly taken away before the request
    looked: reclaimed from its session, expired meanwhile, or broken by an
    administrator. The request holds only some of its names, which is no grant."""
    missing = [name for name, _ in want.items if name not in attempt.tokens]
    return LockLost(
        f"{describe(want.items)}: a release granted every lock of this request, but "
        f"{', '.join(map(repr, missing))} had been taken over before the request learned "
        "of the grant (its session expired, or an administrator broke the lock); the "
        "rest was given back. Acquire again.",
        name=missing[0],
    )


def _deadlock(want: Want, attempt: Attempt) -> Deadlock:
    """The refusal of a request whose wait would have closed a cycle of sessions."""
    cycle = _cycle(want.session_id, attempt.edges)
    names = [name for name, _ in want.items]
    return Deadlock(
        f"{describe(want.items)}: waiting would close a cycle of sessions "
        f"{' -> '.join(s[:8] for s in (*cycle, cycle[0]))} each waiting for the next; "
        "this request was refused so the others can go on. Release what this "
        "session holds (or retry the whole unit of work).",
        name=names[0] if len(names) == 1 else tuple(names),
        mode=want.items[0][1] if len(names) == 1 else None,
        cycle=cycle,
    )


def _until(
    backend: Backend, want: Want, attempt: Attempt, deadline: float | None
) -> Steps[tuple[float | None, float | None] | None]:
    """How long a blocked request may wait, and when it must look again at the latest
    (None: no limit), after judging what is in its way; None to attempt again at once
    (holders in the way were found gone). Raises the typed failure of a request that must
    not wait (`_judge`), or whose time is up."""
    if attempt.rows is None:  # queued without reading what is in the way: see `_look`
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        return remaining, PID_POLL if want.max_hold is None else 0.0  # a hold too long: now
    if (yield from _expire_gone(backend, attempt.rows)):
        return None
    blocked = _judge(attempt.rows, want.max_hold)
    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining <= 0:
        raise _timeout(want, blocked)
    return remaining, blocked.recheck


def _granted_meanwhile(backend: Backend, want: Want) -> Woken:
    """The tokens of the request's names if a release granted it all of them, else False.

    One read, outside every name's lock: a grant is final until its holder releases it.
    """
    names = [name for name, _ in want.items]
    rows = backend.granted(want.request_id, want.session_id, names)
    tokens = {row["name"]: row["token"] for row in rows}
    return tuple(tokens[name] for name in names) if len(tokens) == len(names) else False


def _look(backend: Backend, want: Want, queued: Attempt) -> Attempt | None:
    """What is in the way of a request that queued without looking (`queries.BLOCKED_BY_LIVE`)
    and has waited `PID_POLL` (or to its deadline; with a ``max_hold``, not at all) without
    a grant: as a blocked attempt would have found it, or None to make an attempt instead.

    Most such waits end in a grant before anything needs judging, so the rows are read
    only now, on their own, outside the name's lock that every release of the name
    waits for. Being read outside it, they may be out of date, as any rows are by the
    time a waiter wakes: they decide how to wait, never a grant. A holder gone stale
    meanwhile (to be reclaimed), or nothing in the way at all, is for an attempt to
    settle: it takes the name's lock.
    """
    rows = tuple(
        row
        for name, mode in want.items
        for row in backend.in_the_way(want.request_id, name, mode.value, queued.seq, want.refuse)
    )
    stale = not want.refuse and any(r["kind"] == "holder" and not r["live"] for r in rows)
    return None if stale or not rows else Attempt("blocked", rows=rows)


def _wait(
    backend: Backend, want: Want, rows: Sequence[Row], look_again: float | None
) -> Steps[Woken]:
    """Wait until woken, or ``look_again`` seconds (None: no limit); say what ended it.

    Nothing announces that a holder of another process on this machine was
    killed: its pid is looked at every `PID_POLL` while one is in the way, here,
    without the database. Where a wake-up can be lost, the database is asked
    every `Backend.look_every` whether the request was granted meanwhile
    (`_granted_meanwhile`), which ends the wait if so; the asking does not move
    the moment to look again. Only a wake-up, a grant found so, a death or the
    moment to look again sends the request back to the database.
    """
    mortal = [r for r in rows if _mortal(r)]
    every = backend.look_every
    now = time.monotonic()
    until = None if look_again is None else now + look_again
    ask_at = None if every is None else now + every
    while True:
        woken: Woken = yield Wait(
            _min(_min(look_again, PID_POLL if mortal else None), _until_then(ask_at))
        )
        now = time.monotonic()
        if not woken and every is not None and ask_at is not None and now >= ask_at:
            woken = yield Call(partial(_granted_meanwhile, backend, want))
            ask_at = now + every
        look_again = None if until is None else until - now
        if woken or any(map(process.gone, mortal)) or (look_again is not None and look_again <= 0):
            backend.stats.add("waits")  # one per wait that ends, not per look at a pid
            return woken


def _until_then(moment: float | None) -> float | None:
    """Seconds from now to ``moment`` on `time.monotonic` (None: no moment), at least 0."""
    return None if moment is None else max(0.0, moment - time.monotonic())


def _expire_gone(backend: Backend, rows: Sequence[Row]) -> Steps[bool]:
    """Expire the sessions in the way whose processes have ended on this machine
    (design note, "A holder whose process is gone"); whether there were any."""
    gone = {r["session_id"] for r in rows if r["live"] and process.gone(r)}
    for session_id in sorted(gone):
        yield Call(partial(backend.expire_session, session_id))
    return bool(gone)


def _mortal(row: Row) -> bool:
    """A live holder of another process on this machine, which may die unannounced."""
    return bool(
        row["kind"] == "holder" and row["live"] and row["pid"] != os.getpid() and process.local(row)
    )


def give_back(want: Want, exc: BaseException) -> None:
    """Remove what a request that gives up with ``exc`` left: queue entries, or a grant
    made meanwhile (`Want.abandon`, which retries in the background if the database
    cannot be reached). ``exc`` is what the caller gets, with a note if this failed.

    A request that gave up because the database did not answer (`StoreError`) leaves
    its clean-up to the background at once: its caller has waited its call timeout
    already, and one more call now would most likely wait as long again."""
    later = isinstance(exc, StoreError)
    try:
        want.abandon(want.request_id, [name for name, _ in want.items], later)
    except Exception as cleanup:  # the original error matters more
        exc.add_note(f"removing the abandoned request also failed: {cleanup}")


class _Blocked(NamedTuple):
    holders: tuple[Holder, ...]
    waiters_ahead: int
    recheck: float | None


def _judge(rows: Sequence[Row], max_hold: float | None) -> _Blocked:
    """Turn what is in the way into a verdict: a typed failure, or how long to wait."""
    holders = [r for r in rows if r["kind"] == "holder"]
    for row in holders:
        if not row["live"]:
            raise _unresponsive(row)
        if max_hold is not None and row["now"] - row["since"] > max_hold:
            raise HeldTooLong(
                f"{row['name']!r} has been held by {holder_of(row)}, longer than max_hold "
                f"({max_hold:g} s): giving up instead of waiting behind it. If it is stuck, "
                f"clear it with `lockwarden break {row['name']}`; otherwise raise max_hold.",
                name=row["name"],
                holder=holder_of(row),
            )
    # The earliest moment something in the way may stop counting: a holder or
    # waiter turning stale, a holder passing max_hold, a waiter's deadline.
    moments = [r["heartbeat_at"] + r["ttl"] - r["now"] for r in rows]
    moments += [r["expires_at"] - r["now"] for r in rows if r["expires_at"] is not None]
    if max_hold is not None:
        moments += [r["since"] + max_hold - r["now"] for r in holders]
    return _Blocked(
        holders=tuple(holder_of(r) for r in holders),
        waiters_ahead=len(rows) - len(holders),
        # Clamped: a holder with an absurd TTL must not make this wait overflow.
        recheck=min(max(0.0, min(moments)) + _PAST_THE_EDGE, MAX_WAIT) if moments else None,
    )


def _unresponsive(row: Row) -> HolderUnresponsive:
    holder = holder_of(row)
    why = (
        "whose session has expired"
        if row["expired"]
        else f"whose heartbeat stopped {holder.heartbeat_age:.1f} s ago (TTL {row['ttl']:g} s)"
    )
    return HolderUnresponsive(
        f"{row['name']!r} is held by app {holder.app_id!r} on {holder.host} pid {holder.pid}, "
        f"{why}. The stale policy is 'refuse', so the lock was left alone. If that process "
        f"is gone, clear the lock with `lockwarden break {row['name']}` "
        f"(or store.break_lock({row['name']!r})).",
        name=row["name"],
        holder=holder,
    )


def _timeout(want: Want, blocked: _Blocked) -> LockTimeout:
    how = "is busy" if want.timeout == 0 else f"not granted within {want.timeout:g} s"
    who = "; ".join(map(str, blocked.holders)) or "nobody (waiters queued ahead)"
    ahead = f"; {blocked.waiters_ahead} queued ahead" if blocked.waiters_ahead else ""
    names = tuple(name for name, _ in want.items)
    return LockTimeout(
        f"{describe(want.items)} {how}: held by {who}{ahead}",
        resource=names[0] if len(names) == 1 else names,
        mode=want.items[0][1] if len(names) == 1 else None,
        timeout=want.timeout,
        blockers=blocked.holders,
    )


def describe(items: Sequence[tuple[str, Mode]]) -> str:
    """Words for a request: ``write lock on 'a'`` or ``locks on 'a' (write), 'b' (read)``."""
    word = {Mode.S: "read", Mode.X: "write"}
    if len(items) == 1:
        name, mode = items[0]
        return f"{word[mode]} lock on {name!r}"
    return "locks on " + ", ".join(f"{name!r} ({word[mode]})" for name, mode in items)


def _cycle(me: str, edges: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """A shortest cycle through ``me`` in the waits-for edges (``me`` first)."""
    after: dict[str, list[str]] = {}
    for src, dst in edges:
        after.setdefault(src, []).append(dst)
    parent: dict[str, str] = {}
    queue = deque([me])
    while queue:
        node = queue.popleft()
        for nxt in after.get(node, ()):
            if nxt == me:
                path = [node]
                while path[-1] != me:
                    path.append(parent[path[-1]])
                return tuple(reversed(path))
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return (me,)


def _min(a: float | None, b: float | None) -> float | None:
    present = [x for x in (a, b) if x is not None]
    return min(present) if present else None
