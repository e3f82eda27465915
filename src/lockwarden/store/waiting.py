"""The waiting loop of a lock request, written once for threads and for asyncio.

`acquire_steps` is a generator that decides; it does no I/O itself. It
yields what it needs done — a database call (`Call`) or a wait (`Wait`) —
and a driver does it: `run_sync` in the caller's thread, `aio.run_async` on
an event loop. The loop (design note, "Waiting and wake-ups"):

    attempt (enqueued) -> granted? done
                       -> blocked: wait for a wake-up, the moment a blocker
                          may turn stale or too old, or the deadline -> attempt again

Grants are only ever made by the requester's own attempt, so giving up (a
timeout, an error, a cancelled task) only has to remove what this request
left in the tables: one release call, whatever happened before.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from lockwarden.errors import (
    Deadlock,
    HeldTooLong,
    Holder,
    HolderUnresponsive,
    LockLost,
    LockTimeout,
)
from lockwarden.modes import Mode
from lockwarden.store.backend import AcquireRequest, Attempt, Backend, Row
from lockwarden.store.status import holder_of
from lockwarden.store.wakeups import Subscription

T = TypeVar("T")

_PAST_THE_EDGE = 0.005
"""Look again this long after a blocker's deadline, so that it has certainly passed."""


@dataclass(frozen=True)
class Call:
    """Run a (blocking) database call and send its result back."""

    fn: Callable[[], Any]


@dataclass(frozen=True)
class Wait:
    """Wait up to ``seconds`` (None: without limit); a wake-up ends it early if ``woken``."""

    seconds: float | None
    woken: bool = True


Step = Call | Wait
Steps = Generator[Step, Any, T]


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


def run_sync(steps: Steps[T], sub: Subscription) -> T:
    """Drive ``steps`` in this thread."""
    driver = Driver(steps)
    while (step := driver.next_step()) is not None:
        try:
            if isinstance(step, Call):
                driver.outcome(step.fn())
            elif step.woken:
                sub.wait(step.seconds)
            else:
                time.sleep(step.seconds or 0.0)
        except BaseException as exc:
            driver.outcome(error=exc)
    return driver.result


@dataclass(frozen=True)
class Want:
    """A lock request as the waiting loop needs it."""

    session_id: str
    items: tuple[tuple[str, Mode], ...]
    timeout: float | None
    refuse: bool
    max_hold: float | None
    lock_delay: float
    lost: Callable[[], LockLost]
    """Marks the session lost (the database says it is not live); returns the error to raise."""


def acquire_steps(backend: Backend, want: Want) -> Steps[tuple[str, Mapping[str, int]]]:
    """Acquire ``want.items`` all or nothing; return the request id and each name's token."""
    request_id = secrets.token_hex(16)
    names = tuple(name for name, _ in want.items)
    modes = tuple(mode.value for _, mode in want.items)
    enqueue = want.timeout != 0
    deadline = None if want.timeout is None else time.monotonic() + want.timeout
    left_rows = queued = False
    try:
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            request = AcquireRequest(
                want.session_id, request_id, names, modes, enqueue, want.refuse, remaining, queued
            )
            left_rows = True  # until we know better: even a failed call may have committed
            attempt: Attempt = yield Call(partial(backend.acquire, request))
            if attempt.status == "granted":
                if attempt.reclaimed and want.lock_delay:
                    yield Wait(want.lock_delay, woken=False)
                return request_id, attempt.tokens
            if attempt.status == "lost":
                left_rows = queued  # this attempt changed nothing; an earlier one may have queued
                raise want.lost()
            if attempt.status == "deadlock":
                left_rows = False  # the attempt removed its own queue entries
                cycle = _cycle(want.session_id, attempt.edges)
                raise Deadlock(
                    f"{describe(want.items)}: waiting would close a cycle of sessions "
                    f"{' -> '.join(s[:8] for s in (*cycle, cycle[0]))} each waiting for the next; "
                    "this request was refused so the others can go on. Release what this "
                    "session holds (or retry the whole unit of work).",
                    resource=names[0] if len(names) == 1 else names,
                    mode=want.items[0][1] if len(names) == 1 else None,
                    cycle=cycle,
                )
            left_rows = queued = enqueue
            blocked = _judge(attempt.rows, want.max_hold)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise _timeout(want, blocked)
            yield Wait(_min(remaining, blocked.recheck))
    except GeneratorExit:
        raise
    except BaseException as exc:
        if left_rows:
            try:
                yield Call(partial(backend.release, want.session_id, request_id, names))
            except Exception as cleanup:  # the original error matters more
                exc.add_note(f"removing the abandoned request also failed: {cleanup}")
        raise


@dataclass(frozen=True)
class _Blocked:
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
        recheck=max(0.0, min(moments)) + _PAST_THE_EDGE if moments else None,
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
