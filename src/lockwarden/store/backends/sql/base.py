"""What the SQL backends (SQLite, PostgreSQL, MySQL) share: the shared statements run
through a `Dialect`, the store's tables and their migrations, and how names are
serialized."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from lockwarden.errors import StoreError
from lockwarden.store.backends.base import (
    TAG_LENGTH,
    Backend,
    Opening,
    Params,
    Row,
    Run,
    random_hex,
)
from lockwarden.store.backends.sql import queries, schema
from lockwarden.store.backends.sql.queries import Dialect
from lockwarden.store.listener import Listener
from lockwarden.store.url import StoreURL

T = TypeVar("T")

BUCKETS = 1024
"""Names hash into this many buckets per store: PostgreSQL's advisory-lock keys of a
schema, MySQL's rows of ``lw_buckets``.

A request takes one transaction-level lock per distinct bucket of its names,
in bucket order (so two requests never deadlock on them). Bounding the
buckets bounds what a multi-lock of thousands of names takes from the
server's shared lock table; a collision only makes two names' acquires
queue behind each other for the length of one transaction.
"""

GRAPH_KEY = -1
"""The bucket beside the names' (0 .. BUCKETS - 1) that serializes deadlock checks, so of
two requests closing a cycle the second sees the first."""


class NoStore(StoreError):
    """The database holds no lock store, and it was opened without creating one."""

    def __init__(self, message: str, plan: schema.Plan | None = None) -> None:
        super().__init__(message)
        self.plan = plan
        """What creating the store would do (`check_schema`)."""


class SQLBackend(Backend):
    """A backend that runs the shared SQL of `queries` (SQLite, PostgreSQL, MySQL)."""

    dialect: Dialect
    plan: schema.Plan
    """What opening did to the store's tables (or would do, when only inspecting)."""

    def __init__(self, url: StoreURL) -> None:
        super().__init__(url)
        self._tag = random_hex(TAG_LENGTH // 2)
        """Ends every session id this store makes: a release routes the wake-up of a
        waiter of this store by it (`inbox`; PostgreSQL's grant channel; the id of
        MySQL's doorbell row)."""

    def new_session_id(self) -> str:
        """Random, and ending with this store's tag (`_tag`)."""
        return random_hex(16) + self._tag

    # -- the primitives every SQL backend provides -----------------------------------

    @abstractmethod
    def query(self, sql: str, params: Params | None = None, *, write: bool = False) -> list[Row]:
        """Run one shared statement on its own (in its own transaction if it writes)."""

    @abstractmethod
    def change(self, statements: Sequence[str], params: Params) -> list[list[str | None]]:
        """Run statements that may let waiters in, atomically, and wake the waiters
        of every name they return. Returns each statement's ``name`` column."""

    # -- the seam's operations, as the shared statements ------------------------------

    def open_session(
        self, *, session: str, app_id: str, host: str, pid: int, pid_start: str | None, ttl: float
    ) -> Row:
        params = {"session": session, "app_id": app_id, "host": host, "pid": pid}
        params |= {"pid_start": pid_start, "ttl": ttl}
        return self.query(queries.OPEN_SESSION, params, write=True)[0]

    def heartbeat(self, session: str) -> list[Row]:
        return self.query(queries.HEARTBEAT, {"session": session}, write=True)

    def check(self, session: str, request: str, names: Sequence[str]) -> Row:
        params = {"session": session, "request": request, "names": list(names)}
        return self.query(queries.CHECK, params)[0]

    def close_session(self, session: str) -> None:
        self.change(queries.CLOSE_SESSION, {"session": session})

    def expire_session(self, session: str) -> None:
        self.change(queries.EXPIRE_SESSION, {"session": session})

    def locks(self, name: str | None) -> list[Row]:
        return self.query(queries.LOCKS, {"name": name})

    def waiters(self, name: str | None) -> list[Row]:
        return self.query(queries.WAITERS, {"name": name})

    def sessions(self) -> list[Row]:
        return self.query(queries.SESSIONS)

    def waits_for(self) -> list[Row]:
        return self.query(queries.WAITS_FOR)

    def permits(self, name: str) -> list[Row]:
        return self.query(queries.PERMITS, {"name": name})

    def set_permits(self, name: str, read: int | None, write: int) -> None:
        statements = queries.RESET_PERMITS if (read, write) == (None, 1) else queries.SET_PERMITS
        self.change(statements, {"name": name, "read": read, "write": write})

    def release_app(self, app_id: str, force: bool) -> int:
        params = {"app_id": app_id, "force": force}
        self.change(queries.EXPIRE_APP, params)  # committed before the locks go
        _, holders = self.change(queries.RELEASE_EXPIRED_OF_APP, params)
        return len(holders)

    def break_lock(self, name: str) -> int:
        return len(self.change(queries.BREAK_LOCK, {"name": name})[0])

    def clean(self) -> tuple[int, int, int]:
        self.query(queries.EXPIRE_STALE, write=True)
        waiters, holders, sessions = self.change(queries.CLEAN, {})
        return len(sessions), len(holders), len(waiters)

    def record_admin(
        self, *, id: str, action: str, subject: str, detail: str, host: str, pid: int
    ) -> None:
        params = {"id": id, "action": action, "subject": subject, "detail": detail}
        self.query(queries.RECORD_ADMIN, params | {"host": host, "pid": pid}, write=True)

    def admin_log(self, limit: int) -> list[Row]:
        return self.query(queries.ADMIN_LOG, {"limit": limit})

    def admin_counts(self) -> dict[str, int]:
        return {r["action"]: int(r["n"]) for r in self.query(queries.ADMIN_COUNTS)}

    def reclaimed(self) -> int:
        rows = self.query(queries.RECLAIMED)
        return int(rows[0]["value"]) if rows else 0

    def fence_read(self, resource: str) -> list[Row]:
        return self.query(queries.FENCE_READ, {"resource": resource})

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
        params |= {"session": session, "request": request}
        return self.query(queries.FENCE_ADVANCE, params, write=True)

    def fence_reset(self, resource: str) -> int:
        rows = self.query(queries.FENCE_RESET, {"resource": resource}, write=True)
        return int(rows[0]["token"]) if rows else 0

    def granted(self, request: str, session: str, names: Sequence[str]) -> list[Row]:
        params = {"request": request, "session": session, "names": list(names)}
        return self.query(queries.GRANTED, params)

    def in_the_way(
        self, request: str, name: str, mode: str, seq: int | None, refuse: bool
    ) -> list[Row]:
        params = {"request": request, "name": name, "mode": mode, "seq": seq, "refuse": refuse}
        return self.query(queries.IN_THE_WAY, params)

    def _listener_of(self, run: Callable[[], None], name: str) -> Listener:
        """The thread (named ``name``, running ``run``) that brings this store's wake-ups;
        made once `pokes` is settled."""
        return Listener(
            self._tag, run, name, pokes=self.pokes, wakeups=self.wakeups, stats=self.stats
        )

    @abstractmethod
    def _in_transaction(self, work: Callable[[Run], T]) -> T:
        """Run ``work`` in one transaction, alone: SQLite's ``BEGIN IMMEDIATE`` excludes
        every other writer; on PostgreSQL (where only migrations need this) an advisory
        lock excludes other migrations."""

    @abstractmethod
    def _has_store(self) -> bool:
        """Whether the database holds a lock store (its ``lw_meta`` table), changing nothing."""

    def _no_store(self, backend_steps: Mapping[int, Sequence[str]]) -> NoStore:
        """The error for a database without a store, with the plan of creating one."""
        nothing = schema.plan(self.query, self.url.display, backend_steps, exists=False)
        return NoStore(
            f"no lock store at {self.url.display} (create it with `lockwarden init`)",
            self._shown(nothing),
        )

    def _shown(self, plan: schema.Plan) -> schema.Plan:
        """``plan`` with its statements as the database would receive them, for a person."""
        steps = tuple((v, tuple(map(self.dialect.render, sql))) for v, sql in plan.steps)
        return plan._replace(steps=steps)

    def _migrate(
        self,
        bootstrap: Sequence[str],
        backend_steps: Mapping[int, Sequence[str]],
        opening: Opening = "create",
        then: Callable[[Run], None] | None = None,
    ) -> None:
        """Create or upgrade the store's tables, one process at a time, as ``opening`` says.

        "create": make the tables where there are none. "existing": refuse a
        database without a store, so that a mistyped path or schema is
        reported instead of quietly becoming an empty store (an existing
        store is still upgraded). "inspect": change nothing; `plan` says what
        "create" would do.

        ``then`` runs last in the same transaction, whatever the version found:
        what must follow the library rather than the schema version
        (PostgreSQL's functions, `plpgsql.sync`). Not on a store of a newer
        schema version that this client may use (`schema.COMPATIBLE_FROM`):
        the newer clients' definitions are theirs to keep, and an older
        client writing back its own would undo them on every connect.
        """
        if opening != "create" and not self._has_store():
            raise self._no_store(backend_steps)
        if opening == "inspect":
            self.plan = self._shown(schema.plan(self.query, self.url.display, backend_steps))
            return

        def work(run: Run) -> schema.Plan:
            for statement in (*bootstrap, schema.BOOTSTRAP):
                run(statement)
            found = schema.plan(run, self.url.display, backend_steps)
            if found.refusal:
                raise StoreError(found.refusal)
            for version, statements in found.steps:
                for statement in statements:
                    run(statement)
                run(schema.WRITE_VERSION, {"version": version})
                run(
                    schema.WRITE_COMPATIBLE_FROM,
                    {"compatible_from": schema.compatible_from(version)},
                )
            if then is not None and (found.found or 0) <= schema.SCHEMA_VERSION:
                then(run)
            return found

        self.plan = self._in_transaction(work)
