"""One attempt of the acquire algorithm, in Python, for the backends that run it client-side.

SQLite and MySQL run the steps of the design note ("Acquire", and the grant
of "Release") here, statement by statement, inside a transaction their
backend opened and serialized; PostgreSQL runs the same shared statements
inside PL/pgSQL (`plpgsql`). What differs between the two client-side
backends is passed in as `Engine`: how a counter of ``lw_meta`` hands out
values, how deadlock checks are serialized (SQLite's single writer already
does it; MySQL locks a row), and how a grant takes the locks of a
multi-lock's other names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from lockwarden.store.backends.base import AcquireRequest, Attempt, Row, Run
from lockwarden.store.backends.sql import queries
from lockwarden.store.wakeups import Told


def _nothing(run: Run) -> None:
    """Deadlock checks need no lock of their own (the transaction excludes all others)."""


def _all_locked(run: Run, names: Sequence[str]) -> bool:
    """Every name is locked already (the transaction excludes all others)."""
    return True


class Engine(NamedTuple):
    """What a client-side backend supplies to `attempt`."""

    reserve: Callable[[Run, str, int], int]
    """``reserve(run, counter, n)``: take ``n`` consecutive values of the ``lw_meta``
    counter ("token" or "seq"), in this transaction; return the first."""
    lock_graph: Callable[[Run], None] = _nothing
    """Serialize deadlock checks, so of two requests closing a cycle the second sees the first."""
    try_lock: Callable[[Run, Sequence[str]], bool] = _all_locked
    """``try_lock(run, names)``: lock ``names`` (a multi-lock's names beside the ones a
    release locked) if that can be done at once, and say whether it was. Taken out of
    order, these locks must never be waited for: two grants could wait on each other."""
    grant_head: Callable[[Run, str], list[Row]] | None = None
    """``grant_head(run, name)``: `reserve` a token and run `queries.GRANT_HEAD` with it, in
    one step where the database can (MySQL: one round trip); None: the two in turn."""


def attempt(
    run: Run, request: AcquireRequest, woken: set[str], engine: Engine, *, write: bool = True
) -> Attempt | None:
    """One attempt (design note, "Acquire"); `plpgsql` holds the same steps for PostgreSQL.

    Names whose waiters must be woken after the commit are added to ``woken``.
    Without ``write``, returns None as soon as the attempt would change anything.
    """
    params: dict[str, object] = {
        "session": request.session_id,
        "request": request.request_id,
        "names": request.names,
        "modes": request.modes,
        "refuse": request.refuse,
        "wait": request.wait,
    }
    state = run(queries.ACQUIRE_STATE, params)[0]
    if state["granted"]:  # a retry of a request whose first attempt committed
        return Attempt("granted", _tokens(run(queries.GRANTED, params)))
    if not state["live"]:
        return Attempt("lost")
    params["seq"] = state["seq"]

    reclaimed = False
    rows: list[Row] = []
    while not state["idle"]:
        rows = [
            row
            for name, mode in zip(request.names, request.modes, strict=True)
            for row in run(queries.IN_THE_WAY, params | {"name": name, "mode": mode})
        ]
        if request.refuse or not any(r["kind"] == "holder" and not r["live"] for r in rows):
            break
        if not write:
            return None
        run(queries.RECLAIM_EXPIRE, params)
        if gone := run(queries.RECLAIM_DELETE, params):
            reclaimed = True
            run(queries.COUNT_RECLAIMED, {"removed": len(gone)})
            woken.update(row["name"] for row in gone)

    if not write and (not rows or (request.enqueue and params["seq"] is None)):
        return None
    if not rows:
        first = engine.reserve(run, "token", len(request.names))
        tokens = _tokens(run(queries.INSERT_HOLDERS, params | {"first_token": first}))
        if state["seq"] is not None:
            run(queries.DEQUEUE, params)
        return Attempt("granted", tokens, reclaimed=reclaimed)

    if request.enqueue:
        if params["seq"] is None:
            params["seq"] = engine.reserve(run, "seq", 1)
            run(queries.INSERT_WAITERS, params)
        if run(queries.HOLDS_ANY, params)[0]["holds"]:
            engine.lock_graph(run)
            edges = run(queries.DEADLOCK_EDGES, params)
            if edges:
                if not write:
                    return None
                run(queries.DEQUEUE, params)
                woken.update(request.names)
                return Attempt("deadlock", edges=tuple((e["src"], e["dst"]) for e in edges))
    return Attempt("blocked", reclaimed=reclaimed, rows=tuple(rows))


def _tokens(rows: list[Row]) -> dict[str, int]:
    return {row["name"]: row["token"] for row in rows}


def grant(run: Run, released: Sequence[str], engine: Engine) -> list[Told]:
    """Let in whoever the released names now admit, in queue order (design note, "Release").

    The steps of PostgreSQL's ``lw_grant`` (`plpgsql`), with the same statements, run
    in the release's transaction, which holds the locks of ``released``: first the
    shortcut for the common hand-off (`queries.HEAD_ALONE`), then the loop. A
    multi-lock is granted only if the locks of its other names are free at once
    (`Engine.try_lock`); otherwise it is told to attempt for itself. Returns whom
    to tell after the commit: each granted request, each multi-lock left to
    itself, and the waiters left on the names whose sessions hold locks (their
    attempt runs the deadlock check a grant may now complete), unless the only
    grant was the common hand-off to a session that waits for nothing else.
    """
    told: list[Told] = []
    closed: set[str] = set()
    if len(released) == 1 and (head := _grant_head(run, released[0], engine)):
        told.append(head)
        if not run(queries.WAITS_ANY, {"session": head[1]})[0]["waits"]:
            return told  # no cycle to complete: see `queries.HOLDING_WAITERS`
        candidates = []
    else:
        candidates = run(queries.GRANT_CANDIDATES, {"names": released})
        if not candidates:  # nobody who could be let in waits: nobody to tell either
            return told
    for candidate in candidates:
        if closed.issuperset(released):
            break
        params: dict[str, object] = {
            "session": candidate["session_id"],
            "request": candidate["request_id"],
            "seq": candidate["seq"],
            "refuse": False,  # a dead holder in the way is for the waiter to judge
        }
        items = run(queries.WAITING_ITEMS, params)
        if closed.intersection(item["name"] for item in items):
            continue  # behind a waiter blocked there: blocked too
        others = [item["name"] for item in items if item["name"] not in released]
        if others and not engine.try_lock(run, others):
            told.append((candidate["request_id"], candidate["session_id"], None))
            continue
        blocker = next((item for item in items if run(queries.IN_THE_WAY, params | item)), None)
        if blocker is not None:
            if blocker["name"] in released:
                closed.add(blocker["name"])
            continue
        params["names"] = [item["name"] for item in items]
        params["modes"] = [item["mode"] for item in items]
        first = engine.reserve(run, "token", len(items))
        tokens = run(queries.INSERT_HOLDERS, params | {"first_token": first})
        if not _dequeued(run, params):
            continue
        one = (tokens[0]["token"],) if len(tokens) == 1 else None
        told.append((candidate["request_id"], candidate["session_id"], one))
    held = run(queries.HOLDING_WAITERS, {"names": released})
    return told + [(row["request_id"], row["session_id"], None) for row in held]


def _grant_head(run: Run, name: str, engine: Engine) -> Told | None:
    """The common hand-off in two statements (`queries.HEAD_ALONE`), or None: the loop
    decides. (Where the token is reserved beforehand, a hand-off the loop makes after
    all leaves a gap in the tokens: they still only grow.)"""
    if engine.grant_head is not None:
        granted = engine.grant_head(run, name)
    else:
        first = engine.reserve(run, "token", 1)
        granted = run(queries.GRANT_HEAD, {"name": name, "first_token": first})
    if not granted:
        return None
    head = granted[0]
    if not _dequeued(run, {"request": head["request_id"], "session": head["session_id"]}):
        return None
    return head["request_id"], head["session_id"], (head["token"],)


def _dequeued(run: Run, params: dict[str, object]) -> bool:
    """Dequeue the request just granted; if its queue entry was gone, take the grant back.

    A close deletes a session's waiter rows before its holder rows. Where the close
    deleted them first (on MySQL this dequeue then waits for the close to commit), the
    grant went to a session that is gone, and would outlive it; where the grant came
    first, the close's deletion waits for it, and the close's next statement deletes
    the new holder rows. (SQLite runs one transaction at a time: never taken back.)
    """
    if run(queries.DEQUEUED, params):
        return True
    run(queries.UNGRANT, params)
    return False
