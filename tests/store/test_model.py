"""The grant decisions of every backend against a reference model (Hypothesis, stateful).

The model is the design note's rules written as plainly as possible: a
request is granted iff, for each (name, mode) it asks for, nothing that
counts is in the way — a holder of the other mode, a queued request ahead of
it in the other mode, or its own mode at the permit cap counting holders and
requests ahead. A queued request of a session holding locks is refused as a
deadlock iff the waits-for graph has a cycle through its session. A release
or a give-up then grants, in arrival order, every queued request on its
names that nothing is in the way of any more (PostgreSQL, SQLite, MySQL); on
etcd, if it is of one name, only the first such request for that name alone
(its design note, "Grant on release").
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from lockwarden.store import Store
from lockwarden.store.backends.base import AcquireRequest
from lockwarden.store.backends.etcd.backend import EtcdBackend
from lockwarden.store.backends.mysql.backend import MySQLBackend
from lockwarden.store.backends.postgresql.backend import PostgresBackend
from lockwarden.store.backends.sqlite.backend import SQLiteBackend
from tests.conftest import empty_locks

NAMES = ("a", "b", "c")
SESSIONS = 3

items_strategy = st.lists(
    st.tuples(st.sampled_from(NAMES), st.sampled_from(["S", "X"])),
    min_size=1,
    max_size=2,
    unique_by=lambda item: item[0],
)


@dataclass
class Request:
    id: str
    session: int
    items: list[tuple[str, str]]
    order: int = 0


def test_grant_decisions_match_the_model(store: Store) -> None:
    backend = store._backend
    grants_one = isinstance(backend, EtcdBackend)
    sessions = [store.session(app_id=f"m{i}", ttl=600) for i in range(SESSIONS)]
    for s in sessions:
        store._heartbeat.remove(s)  # the model steps run quickly; no beats in between needed
    ids = [s.id for s in sessions]
    order = itertools.count(1)

    class Model(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            empty_locks(store)
            self.held: list[Request] = []
            self.queued: list[Request] = []
            self.permits: dict[str, tuple[int | None, int]] = {}
            self.last_token = max((e.token for e in store.locks()), default=0)

        # -- the model ---------------------------------------------------------------

        def cap(self, name: str, mode: str) -> int | None:
            read, write = self.permits.get(name, (None, 1))
            return write if mode == "X" else read

        def blocked(self, request: Request) -> bool:
            ahead = [
                q
                for q in self.queued
                if q.id != request.id and (not request.order or q.order < request.order)
            ]
            for name, mode in request.items:
                others = [m for h in self.held for n, m in h.items if n == name]
                others += [m for q in ahead for n, m in q.items if n == name]
                cap = self.cap(name, mode)
                if any(m != mode for m in others) or (
                    cap is not None and others.count(mode) >= cap
                ):
                    return True
            return False

        def closes_cycle(self, session: int) -> bool:
            edges: set[tuple[int, int]] = set()
            for w in self.queued:
                for name, mode in w.items:
                    ahead = [(h.session, m) for h in self.held for n, m in h.items if n == name]
                    ahead += [
                        (q.session, m)
                        for q in self.queued
                        if q.order < w.order
                        for n, m in q.items
                        if n == name
                    ]
                    for other, m in ahead:
                        if other != w.session and (m != mode or self.cap(name, mode) == 1):
                            edges.add((w.session, other))
            seen, todo = set(), [dst for src, dst in edges if src == session]
            while todo:
                node = todo.pop()
                if node not in seen:
                    seen.add(node)
                    todo.extend(dst for src, dst in edges if src == node)
            return session in seen

        def attempt(self, request: Request, enqueue: bool, fought: bool) -> None:
            # The SQL backends choose their statements by whether the store saw the names
            # fought over lately (`FoughtOver`): either way, the same decision.
            if isinstance(backend, SQLiteBackend | MySQLBackend | PostgresBackend):
                backend._contended.note([n for n, _ in request.items], fought=fought)
            got = backend.acquire(
                AcquireRequest(
                    ids[request.session],
                    request.id,
                    tuple(n for n, _ in request.items),
                    tuple(m for _, m in request.items),
                    enqueue,
                    False,
                    None,
                )
            )
            if not self.blocked(request):
                assert got.status == "granted", got
                assert set(got.tokens) == {n for n, _ in request.items}
                assert min(got.tokens.values()) > self.last_token
                self.last_token = max(got.tokens.values())
                self.held.append(request)
                if request in self.queued:
                    self.queued.remove(request)
                return
            holds = any(h.session == request.session for h in self.held)
            # PostgreSQL, SQLite and MySQL queue a write request at once, without reading
            # what is in its way, when a live session holds the name and nothing else is
            # at stake (SQLite and MySQL on names fought over only, PostgreSQL in `lw_lock`,
            # which a calm name's try falls back to; etcd never).
            [(name, mode)] = request.items if len(request.items) == 1 else [("", "")]
            at_once = (
                isinstance(backend, PostgresBackend)
                or (fought and isinstance(backend, SQLiteBackend | MySQLBackend))
            ) and (
                enqueue
                and not request.order
                and not holds
                and mode == "X"
                and self.cap(name, mode) == 1
                and any(n == name for h in self.held for n, _ in h.items)
            )
            if enqueue and not request.order:
                request.order = next(order)
                self.queued.append(request)
            if enqueue and holds and self.closes_cycle(request.session):
                assert got.status == "deadlock", got
                self.queued.remove(request)
            else:
                assert got.status == "blocked", got
                assert got.rows is None if at_once else got.rows, got

        # -- the rules -----------------------------------------------------------------

        @rule(
            session=st.integers(0, SESSIONS - 1),
            items=items_strategy,
            enqueue=st.booleans(),
            fought=st.booleans(),
        )
        def request(
            self, session: int, items: list[tuple[str, str]], enqueue: bool, fought: bool
        ) -> None:
            self.attempt(Request(secrets.token_hex(8), session, items), enqueue, fought)

        @precondition(lambda self: self.queued)
        @rule(data=st.data())
        def retry(self, data: st.DataObject) -> None:
            self.attempt(data.draw(st.sampled_from(self.queued)), True, data.draw(st.booleans()))

        @precondition(lambda self: self.held)
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            request = data.draw(st.sampled_from(self.held))
            names = [n for n, _ in request.items]
            assert backend.release(ids[request.session], request.id, names) == len(names)
            self.held.remove(request)
            self.pass_on(names)

        @precondition(lambda self: self.queued)
        @rule(data=st.data())
        def give_up(self, data: st.DataObject) -> None:
            request = data.draw(st.sampled_from(self.queued))
            names = [n for n, _ in request.items]
            assert backend.release(ids[request.session], request.id, names) == 0
            self.queued.remove(request)
            self.pass_on(names)

        def pass_on(self, names: list[str]) -> None:
            """What a release grants on its way out: the queued requests on its names that
            nothing is in the way of any more, in arrival order (on etcd, the first one
            that asks for the one name released, alone)."""
            if grants_one and len(names) > 1:
                return
            granted = 0
            for q in sorted(self.queued, key=lambda q: q.order):
                if grants_one and (granted or [n for n, _ in q.items] != names):
                    continue
                if any(n in names for n, _ in q.items) and not self.blocked(q):
                    self.queued.remove(q)
                    self.held.append(q)
                    granted += len(q.items)
            tokens = [e.token for e in store.locks()]
            assert len([t for t in tokens if t > self.last_token]) == granted  # fresh tokens
            self.last_token = max(tokens, default=self.last_token)

        @rule(
            name=st.sampled_from(NAMES),
            read=st.sampled_from([None, 1, 2]),
            write=st.sampled_from([1, 2]),
        )
        def set_permits(self, name: str, read: int | None, write: int) -> None:
            store.set_permits(name, read=read, write=write, force=True)  # caps apply at once
            self.permits[name] = (read, write)

        @invariant()
        def tables_match(self) -> None:
            held = sorted((e.name, e.mode.value, e.holder.session_id) for e in store.locks())
            assert held == sorted((n, m, ids[h.session]) for h in self.held for n, m in h.items)
            queued = [(w.name, w.session_id) for w in store.waiters()]
            by_arrival = sorted(self.queued, key=lambda q: q.order)
            expected = [(n, ids[q.session]) for q in by_arrival for n, _ in q.items]
            expected.sort(key=lambda item: item[0])  # stable: arrival order within a name
            assert queued == expected

    run_state_machine_as_test(
        Model, settings=settings(max_examples=30, stateful_step_count=25, deadline=None)
    )
    for s in sessions:
        s.close()
