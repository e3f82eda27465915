"""One attempt of the acquire algorithm, in Python, for the backends that run it client-side.

SQLite and MySQL run the steps of the design note ("Acquire") here, statement
by statement, inside a transaction their backend opened and serialized;
PostgreSQL runs the same shared statements inside PL/pgSQL (`plpgsql`). What
differs between the two client-side backends is passed in as `Engine`: how a
counter of ``lw_meta`` hands out values, and how deadlock checks are
serialized (SQLite's single writer already does it; MySQL locks a row).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lockwarden.store import queries
from lockwarden.store.backend import AcquireRequest, Attempt, Row, Run


def _nothing(run: Run) -> None:
    """Deadlock checks need no lock of their own (the transaction excludes all others)."""


@dataclass(frozen=True)
class Engine:
    """What a client-side backend supplies to `attempt`."""

    reserve: Callable[[Run, str, int], int]
    """``reserve(run, counter, n)``: take ``n`` consecutive values of the ``lw_meta``
    counter ("token" or "seq"), in this transaction; return the first."""
    lock_graph: Callable[[Run], None] = _nothing
    """Serialize deadlock checks, so of two requests closing a cycle the second sees the first."""


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
