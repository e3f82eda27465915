"""The PostgreSQL backend: the lock functions, the LISTEN thread.

Acquire and release are one round trip each: on a name this store has not seen
fought over, the name's advisory lock and one statement (`queries.TAKE_IDLE`,
`queries.RELEASE_IDLE`) sent together; otherwise, or when that statement finds
the name taken or waited for, a call of the PL/pgSQL functions of `plpgsql`,
which run the whole algorithm. A release grants the waiters it lets in. It
tells those of its own machine itself, after the commit, by a poke to their
store's inbox (`inbox`), and the others are sent a NOTIFY on the channel of
their store; changes that only let waiters look again notify a channel of
the names. One thread per waiting store reads its inbox and its LISTEN
connection and hands each message to the local waiters it concerns.
Connections and retries are `pgconn`'s; an acquire is retried with the same
request id, so a retried acquire is recognised rather than granted twice.
"""

from __future__ import annotations

import hashlib
import json
import select
import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import cache
from typing import TYPE_CHECKING, Final, TypeVar

from lockwarden.errors import StoreError
from lockwarden.store import inbox, wakeups
from lockwarden.store.backends.base import (
    TAG_LENGTH,
    AcquireRequest,
    Attempt,
    FoughtOver,
    Opening,
    Params,
    Row,
    Run,
)
from lockwarden.store.backends.postgresql import plpgsql
from lockwarden.store.backends.postgresql.connections import (
    Connections,
    Prepared,
    Step,
    TextArgs,
    TextRow,
    describe,
)
from lockwarden.store.backends.postgresql.url import import_psycopg
from lockwarden.store.backends.sql import queries
from lockwarden.store.backends.sql.base import SQLBackend
from lockwarden.store.backends.sql.calm import CalmRelease
from lockwarden.store.url import StoreURL
from lockwarden.store.wakeups import Told

if TYPE_CHECKING:
    from lockwarden.store.backends.postgresql.connections import Connection


T = TypeVar("T")


_LISTEN_POLL = 0.2
"""How long the listener waits for a notification before checking whether the store closed.

This is a local wait on the socket, not a query: no statement is sent.
"""

_LISTEN_IDLE = 10.0
"""Seconds without a waiter after which a store closes its LISTEN connection.

PostgreSQL signals every connection of the database that listens, on any channel,
at each commit that notifies; an idle process's listener would cost every grant made
in that database (design note, "Listening connections"). The next wait opens it again.
"""

_ACQUIRE = (
    "SELECT {p}lw_acquire(:session, :request, :names::text[], :modes::text[],"
    " :enqueue, :refuse, :wait, :relaxed) AS result"
)
# The hot path's statements, prepared once per connection (`connections.Connections.call`).
_LOCK = (
    "SELECT * FROM {schema}.lw_lock($1::text, $2::text, $3::text, $4::text,"
    " $5::boolean, $6::boolean, $7::double precision, $8::boolean)"
)
_RELEASE_ONE = (
    "SELECT * FROM {schema}.lw_release($1::text, $2::text, ARRAY[$3::text], $4::boolean, $5::text)"
)
_RELEASE = "SELECT * FROM {p}lw_release(:session, :request, :names::text[], :relaxed, :near)"
_NOTIFY = (
    "SELECT count(pg_notify(c, m)) AS sent"
    " FROM unnest(CAST(:channels AS text[]), CAST(:messages AS text[])) AS t(c, m)"
)
"""What a release could not poke, notified instead (`PostgresBackend._tell`)."""


class PostgresBackend(CalmRelease, SQLBackend):
    def __init__(self, url: StoreURL, *, relaxed: bool, opening: Opening = "create") -> None:
        super().__init__(url)
        self._psycopg = import_psycopg()
        self._connections = Connections(url)
        self.dialect = queries.postgres(url.schema)
        self.relaxed = relaxed
        self._lock = _prepared(_LOCK.format(schema=url.schema))
        self._release_one = _prepared(_RELEASE_ONE.format(schema=url.schema))
        self._lock_name = _prepared(plpgsql.lock_name(url.schema))
        self._take_idle_one = _prepared(_positional(self.dialect.render(queries.TAKE_IDLE)))
        self._release_idle_one = _prepared(_positional(self.dialect.render(queries.RELEASE_IDLE)))
        self._contended = FoughtOver()
        self._release_many = self.dialect.render(_RELEASE)
        self._relaxed = _BOOL[relaxed]
        near = inbox.near()
        self._near = None if near is None else near.encode()
        """`inbox.near`, as a prepared call's argument: the releases of this store poke the
        waiters whose sessions' identities begin so."""
        if self._near is not None:
            self.pokes, self.look_every = True, inbox.LOOK_EVERY
        self._outbox = inbox.Outbox()
        self._closed = threading.Event()
        self._listening = threading.Event()
        self._listener = self._listener_of(self._listen, "lockwarden-listen")
        self._migrate(
            (f"CREATE SCHEMA IF NOT EXISTS {url.schema}",),
            plpgsql.steps(url.schema),
            opening,
            lambda run: plpgsql.sync(run, url.schema),
        )

    def _has_store(self) -> bool:
        rows = self.query(
            "SELECT to_regclass(:meta) IS NOT NULL AS found", {"meta": f"{self.url.schema}.lw_meta"}
        )
        return bool(rows[0]["found"])

    # -- running statements ----------------------------------------------------------

    def _run(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` on a pooled connection, retried as `pgconn` says."""
        return self._connections.run(work, lambda: self.stats.add("retries"))

    def _call(self, conn: Connection, *steps: Step) -> TextRow | None:
        """Run hot-path statements in one round trip: prepared, text in and out
        (`Connections.call`)."""
        self.stats.add("statements")
        return self._connections.call(conn, *steps)

    def _name_lock(self, name: bytes) -> Step:
        """The step that takes the advisory lock of ``name`` for the rest of a call's
        transaction, as the functions do: the statements after it see everything
        committed before it was granted."""
        return self._lock_name, [name, self._relaxed]

    def _execute(self, conn: Connection, text: str, params: Params | None) -> list[Row]:
        self.stats.add("statements")
        cur = conn.execute(text, params or {})
        return cur.fetchall() if cur.description else []

    def _in_transaction(self, work: Callable[[Run], T]) -> T:
        def run_in(conn: Connection) -> T:
            def run(sql: str, params: Params | None = None) -> list[Row]:
                return self._execute(conn, self.dialect.render(sql), params)

            with conn.transaction():
                run(
                    "SELECT pg_advisory_xact_lock(:key, :part)",
                    {"key": plpgsql.lock_key(self.url.schema), "part": plpgsql.MIGRATION_KEY},
                )
                return work(run)

        return self._run(run_in)

    def query(self, sql: str, params: Params | None = None, *, write: bool = False) -> list[Row]:
        text = self.dialect.render(sql)
        return self._run(lambda conn: self._execute(conn, text, params))

    def change(self, statements: Sequence[str], params: Params) -> list[list[str | None]]:
        """Run ``statements`` in order in one transaction, each notifying the names it
        returns: one round trip (a pipeline), and each statement sees what the ones before
        it did and what committed before it began, as on the other backends."""
        channel = plpgsql.channel(self.url.schema)
        texts = [self.dialect.render(_notifying(sql, channel)) for sql in statements]

        def work(conn: Connection) -> list[list[str | None]]:
            with conn.pipeline(), conn.transaction():
                cursors = [conn.execute(text, params) for text in texts]
            self.stats.add("statements", len(texts))
            return [[row["name"] for row in cur.fetchall()] for cur in cursors]

        return self._run(work)

    # -- the lock functions ----------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> Attempt:
        self.stats.add("attempts")
        if len(request.names) == 1:  # one name: a free one is granted by one insert
            name = request.names[0]
            key = name.encode()
            args: TextArgs = [
                request.session_id.encode(),
                request.request_id.encode(),
                key,
                request.modes[0].encode(),
            ]
            # Plain statements where the name is likely free (no function called: "Cost"
            # in the design note); `lw_lock` tries the same insert first anyway.
            if not request.queued and name not in self._contended:
                take = (self._take_idle_one, args)
                taken = self._run(lambda conn: self._call(conn, self._name_lock(key), take))
                if taken is not None:
                    return Attempt("granted", {name: int(_value(taken[0]))})
            args += [
                _BOOL[request.enqueue],
                _BOOL[request.refuse],
                None if request.wait is None else repr(request.wait).encode(),
                self._relaxed,
            ]
            row = self._run(lambda conn: self._call(conn, (self._lock, args)))
            assert row is not None  # lw_lock returns a token or an outcome
            token, result = row
            if token is not None:
                found = Attempt("granted", {name: int(token)})
            else:
                found = Attempt.from_dict(json.loads(_value(result)))
            self._contended.note(request.names, found.status != "granted")
            return found
        rows = self.query(
            _ACQUIRE,
            {
                "session": request.session_id,
                "request": request.request_id,
                "names": list(request.names),
                "modes": list(request.modes),
                "enqueue": request.enqueue,
                "refuse": request.refuse,
                "wait": request.wait,
                "relaxed": self.relaxed,
            },
        )
        return Attempt.from_dict(rows[0]["result"])

    def _release_contended(
        self, session_id: str, request_id: str, names: Sequence[str]
    ) -> tuple[int, int]:
        sent = 0

        def work(conn: Connection) -> tuple[int, str | None]:
            nonlocal sent
            sent += 1
            if len(names) == 1:  # the common case, prepared: no array to adapt
                args: TextArgs = [
                    session_id.encode(),
                    request_id.encode(),
                    names[0].encode(),
                    self._relaxed,
                    self._near,
                ]
                row = self._call(conn, (self._release_one, args))
                assert row is not None  # lw_release returns how many it deleted
                count, pokes = row
                return int(_value(count)), None if pokes is None else pokes.decode()
            params = {"session": session_id, "request": request_id, "names": list(names)}
            near = None if self._near is None else self._near.decode()
            rows = self._execute(
                conn, self._release_many, {**params, "relaxed": self.relaxed, "near": near}
            )
            return int(rows[0]["_n"]), rows[0]["_pokes"]

        deleted, pokes = self._run(work)
        if pokes or sent > 1:
            self._tell(pokes, names if sent > 1 else ())
        return deleted, sent

    def _release_idle(self, session_id: str, request_id: str, name: str) -> tuple[bool, bool]:
        """`queries.RELEASE_IDLE` under the name's lock (a waiter queueing meanwhile is
        seen): whether it released the name, and whether it was resent after its
        connection dropped. If it did not (someone waits, nothing was held, or a first
        sending committed), nothing changed and the full release decides."""
        key = name.encode()
        args: TextArgs = [session_id.encode(), request_id.encode(), key]
        sent = 0

        def work(conn: Connection) -> bool:
            nonlocal sent
            sent += 1
            release = (self._release_idle_one, args)
            return self._call(conn, self._name_lock(key), release) is not None

        return self._run(work), sent > 1

    def _tell(self, pokes: str | None, resent: Sequence[str]) -> None:
        """Tell the waiters of this machine that a release let in what it did: ``pokes``,
        one ``"<session id> <request id>[ <token>]"`` a line. Those of this store at once,
        the others through their stores' inboxes (`inbox.tell`); what cannot go that way
        goes by NOTIFY. A release that was ``resent`` after its connection dropped may
        have let waiters in whose pokes are lost with the first answer: every waiter of
        its names looks again."""
        told = [_told(line) for line in pokes.split("\n")] if pokes else []
        unreached = inbox.tell(told, self._tag, self.wakeups, self._outbox)
        channels = [plpgsql.grant_channel(session[-TAG_LENGTH:]) for _, session, _ in unreached]
        messages = [wakeups.message(request, tokens) for request, _, tokens in unreached]
        for name in resent:
            channels.append(plpgsql.channel(self.url.schema))
            messages.append(name)
        if channels:
            # The release stands whatever happens here: at worst the waiters look again
            # within `inbox.LOOK_EVERY`.
            with suppress(StoreError):
                self.query(_NOTIFY, {"channels": channels, "messages": messages})

    # -- wake-ups --------------------------------------------------------------------

    def _watch(self, timeout: float | None) -> None:
        # If LISTEN cannot be had, the listener's retries wake every waiter (polling).
        self._listener.start(timeout)

    def _listen(self) -> None:
        """Keep a LISTEN connection, and while there is none, poll: wake every waiter at
        each reconnect attempt (`Listener.failed`). Back on push as soon
        as LISTEN is in force again. End once nobody has waited for `_LISTEN_IDLE`."""
        names = plpgsql.channel(self.url.schema)
        requests = plpgsql.grant_channel(self._tag)
        failures = 0
        while not self._closed.is_set():
            if self.wakeups.unwatch(_LISTEN_IDLE, self._unwatch):
                return
            try:
                conn = self._connections.connect(retry=False)
                stopped = False
                try:
                    conn.execute(f"LISTEN {names}")
                    conn.execute(f"LISTEN {requests}")
                    # Notifications sent while nobody listened are lost: everyone looks again.
                    self._listening.set()
                    self._listener.tried.set()
                    self.wakeups.wake_all()
                    failures = 0
                    while not self._closed.is_set():
                        self._receive(conn, requests)
                        stopped = self.wakeups.unwatch(_LISTEN_IDLE, self._unwatch)
                        if stopped:
                            return
                finally:
                    if not stopped:  # else a listener started since may be listening
                        self._listening.clear()
                    conn.close()
            except Exception as exc:  # a StoreError from connect, a psycopg.Error after
                pause = self._listener.failed(
                    failures,
                    f"lock store {self.url.display}: no LISTEN connection, waiters poll until "
                    f"it is back: {describe(self.url, exc)}",
                )
                failures += 1
                self._closed.wait(pause)

    def _receive(self, conn: Connection, requests: str) -> None:
        """Wait up to `_LISTEN_POLL` for notifications and pokes, and hand each to the
        waiters it concerns."""
        pg, box = conn.pgconn.socket, self._listener.inbox
        fds = [pg] if box is None else [pg, box.fileno()]
        ready, _, _ = select.select(fds, [], [], _LISTEN_POLL)
        if box is not None and box.fileno() in ready:
            self._listener.hand_on([box])
        if pg in ready:
            for note in conn.notifies(timeout=0):
                if note.channel == requests:
                    self.wakeups.deliver(note.payload)
                else:
                    self.wakeups.wake((note.payload,))

    def _unwatch(self) -> None:
        """The listener stops (`Wakeups.unwatch`, under its lock, so no `_watch` runs
        meanwhile): the next `_watch` starts another, and waits for its LISTEN."""
        self._listening.clear()
        self._listener.stopped()

    @property
    def listening(self) -> bool:
        """Whether wake-ups come by NOTIFY now (else waiters poll)."""
        return self._listening.is_set()

    def close(self) -> None:
        self._closed.set()
        self._listener.close(timeout=2 * _LISTEN_POLL + 1.0)
        self._connections.close()
        self._outbox.close()


def _told(line: str) -> Told:
    """One line of `lw_release`'s pokes, ``"<session id> <request id>[ <token>]"``, as
    `inbox.tell` takes it."""
    session, _, message = line.partition(" ")
    request, tokens = wakeups.read(message)
    return request, session, tokens


_BOOL = {True: b"t", False: b"f"}
"""A boolean parameter of a prepared call, as text."""


def _prepared(text: str) -> Prepared:
    """A hot-path statement, under a name that differs wherever its text does."""
    body = text.encode()
    return Prepared(b"lockwarden_" + hashlib.sha1(body).hexdigest()[:16].encode(), body)


_POSITIONS: Final = ("session", "request", "name", "mode")
"""The parameters of the plain hot-path statements, in the order a call passes them."""


def _positional(text: str) -> str:
    """A statement rendered for psycopg (``%(name)s``) with `_POSITIONS` as ``$1``, ``$2``, …
    (text), for `Connections.call`."""
    for number, param in enumerate(_POSITIONS, 1):
        text = text.replace(f"%({param})s", f"${number}::text")
    assert "%(" not in text, "every parameter has a position"
    return text


def _value(value: bytes | None) -> bytes:
    """A value a hot-path statement never returns as NULL."""
    assert value is not None
    return value


@cache
def _notifying(statement: str, channel: str) -> str:
    """``statement``, notifying every name it returns (a data-modifying CTE runs whether
    referenced or not)."""
    return (
        f"WITH changed AS ({statement}), "
        f"woken AS (SELECT pg_notify('{channel}', name) FROM "
        "(SELECT DISTINCT name FROM changed WHERE name IS NOT NULL) AS n) "
        "SELECT name FROM changed, (SELECT count(*) FROM woken) AS w"
    )
