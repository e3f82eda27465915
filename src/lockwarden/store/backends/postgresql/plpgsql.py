"""The PostgreSQL functions that make acquire and release one round trip each, and
the grant a release makes to the waiters it lets in.

They run the algorithm of the design note with the shared statements of
`queries`, so the SQL a grant decision rests on is the same text that SQLite
runs. What is PostgreSQL's own: the advisory locks that serialize requests
for a name, the token sequence and its jump after a server restart (design
note, "Durability"), and NOTIFY (a grant to a waiter of the releaser's machine is
returned to the releaser's client instead, which pokes the waiter: `postgres`).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from typing import Final

from lockwarden.store.backends.base import TAG_LENGTH, Run
from lockwarden.store.backends.sql import queries
from lockwarden.store.backends.sql.base import BUCKETS, GRAPH_KEY


def lock_key(schema: str) -> int:
    """The first advisory-lock key of a schema: its stores never contend with another schema's."""
    return zlib.crc32(schema.encode()) - 2**31


# Second advisory-lock keys besides the name buckets (0 .. BUCKETS - 1), the first
# (`GRAPH_KEY`) shared with MySQL's bucket rows.
MIGRATION_KEY = -2
"""Serializes schema migrations between processes."""


def _bucket(name: str) -> str:
    """The bucket of a name, in SQL, from a text expression."""
    return f"(hashtextextended({name}, 0) & {BUCKETS - 1})::integer"


_PLANNER: Final = (
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_bitmapscan", "off"),
    ("enable_seqscan", "off"),
)
"""How the statements of the hot path are planned (design note, "Cost"): the functions'
``SET`` clauses, and the transaction of a plain call (`lock_name`)."""


def lock_name(schema: str) -> str:
    """A statement that takes the advisory lock of the name ``$1`` until the transaction
    ends, as the functions do, gives the transaction the functions' planner settings, and
    lets it commit without waiting for the disk if ``$2`` (relaxed durability). What a
    client sends before the statements it runs under the name's lock, in the same
    transaction (`connections.Connections.call`)."""
    settings = "".join(f", set_config('{key}', '{value}', true)" for key, value in _PLANNER)
    return (
        f"SELECT pg_advisory_xact_lock({lock_key(schema)}, {_bucket('$1::text')}){settings},"
        " CASE WHEN $2::boolean THEN set_config('synchronous_commit', 'off', true) END"
    )


def channel(schema: str) -> str:
    """The NOTIFY channel of a schema's store: lock names whose waiters must look again."""
    return f"lockwarden_{schema}"


def grant_channel(tag: str) -> str:
    """The NOTIFY channel of one store's waiting requests (design note, "Release").

    Every session id of a store ends with the store's random tag, so a release
    notifies the listener of the waiter's own store, and no other process
    wakes. The payload is the request id, then its token if the release
    granted it one name: ``"<request id> <token>"``. A request id alone asks
    the request to attempt again (its attempt finds a grant made to it, if any).
    """
    return f"lw_{tag}"


def _grant_channel_of(session: str) -> str:
    """`grant_channel` in SQL, from a session id expression."""
    return f"'lw_' || right({session}, {TAG_LENGTH})"


_GRANT_HEAD: Final = f"""
{queries.HEAD_ALONE},
dequeued AS (
    DELETE FROM {{p}}lw_waiters AS w USING alone
    WHERE w.request_id = alone.request_id AND w.session_id = alone.session_id
    RETURNING w.request_id, w.session_id
),
granted AS (
    INSERT INTO {{p}}lw_holders (request_id, name, mode, session_id, token, granted_at)
    SELECT request_id, :name, 'X', session_id, {{token}}, {{now}} FROM dequeued
    RETURNING request_id, session_id, token
)
SELECT request_id, session_id, token INTO _request, _session, _token FROM granted
"""
"""`queries.HEAD_ALONE`'s waiter dequeued and granted in one statement (data-modifying
CTEs); no variable set if `lw_grant`'s loop must decide. Only what the deletion removed
is granted: a waiter whose rows a close deleted meanwhile (committed once the deletion
stops waiting for it) gets nothing (design note, "Release")."""


def functions(schema: str) -> list[str]:
    """``CREATE OR REPLACE FUNCTION`` statements for a schema (kept current by `sync`).

    A PL/pgSQL function pays for every statement it runs, so the common
    paths are short: a single-name acquire of a free name is one insert
    (`lw_lock`), a release one delete, and only a release that finds
    waiters runs the grant (`lw_grant`). They run with generic plans, and
    without bitmap or sequential scans (design note, "Cost").
    """
    d = queries.plpgsql(schema)
    key = lock_key(schema)
    notify = channel(schema)

    def tell(session: str, message: str) -> str:
        # A waiting request of the releaser's machine is told by the releaser's client,
        # through its store's inbox, after the commit; any other by NOTIFY (design note,
        # "Release"). A NOTIFY signals every listening connection of the database.
        return f"""
            IF _near IS NOT NULL AND EXISTS (
                SELECT 1 FROM {schema}.lw_sessions AS s
                WHERE s.id = {session} AND starts_with(s.pid_start, _near))
            THEN
                _pokes := concat_ws(E'\\n', _pokes, {session} || ' ' || {message});
            ELSE
                PERFORM pg_notify({_grant_channel_of(session)}, {message});
            END IF;"""

    # The token travels with the request id when the grant is of one name.
    one_token = "_request || CASE WHEN cardinality(_tokens) = 1 THEN ' ' || _tokens[1] ELSE '' END"

    def lock_names(names: str) -> str:
        return f"""
    IF cardinality({names}) = 1 THEN
        PERFORM pg_advisory_xact_lock({key}, {_bucket(f"{names}[1]")});
    ELSE
        PERFORM pg_advisory_xact_lock({key}, k.bucket)
        FROM (SELECT DISTINCT {_bucket("n")} AS bucket FROM unnest({names}) AS n ORDER BY 1) AS k;
    END IF;"""

    # How the functions are planned (design note, "Cost").
    planner = "LANGUAGE plpgsql" + "".join(f"\nSET {key} = {value}" for key, value in _PLANNER)
    relax = """
    IF _relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;"""
    # Before any grant: if the server restarted since the last one, tokens move on to the
    # next 2^40 range, durably, so that none repeats one a crash may have forgotten
    # (design note, "Durability").
    move_on = f"""
        UPDATE {schema}.lw_meta SET value = {d.started}
        WHERE key = 'started' AND value <> {d.started};
        IF FOUND THEN
            PERFORM setval('{schema}.lw_token_seq', ((last_value >> 40) + 1) << 40, false)
            FROM {schema}.lw_token_seq;
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;"""
    acquire = f"""
CREATE OR REPLACE FUNCTION {schema}.lw_acquire(
    _session text, _request text, _names text[], _modes text[],
    _enqueue boolean, _refuse boolean, _wait double precision, _relaxed boolean)
RETURNS jsonb
{planner}
AS $fn$
DECLARE
    _now double precision;
    _state record;
    _seq bigint;
    _i integer;
    _name text;
    _mode text;
    _rows jsonb;
    _dead boolean;
    _gone text[];
    _removed bigint;
    _reclaimed boolean := false;
    _tokens jsonb;
    _edges jsonb;
BEGIN
    {relax}
    {lock_names("_names")}
    _now := date_part('epoch', clock_timestamp());
    SELECT * INTO _state FROM ({d.render(queries.ACQUIRE_STATE)}) AS st;
    IF _state.granted THEN  -- a retry of a request whose first attempt committed, or a
                            -- request that a release granted while it waited
        SELECT jsonb_object_agg(g.name, g.token) INTO _tokens
        FROM ({d.render(queries.GRANTED)}) AS g;
        RETURN jsonb_build_object('status', 'granted', 'tokens', _tokens);
    END IF;
    IF NOT coalesce(_state.live, false) THEN
        RETURN jsonb_build_object('status', 'lost');
    END IF;
    _seq := _state.seq;

    _rows := '[]';
    LOOP
        EXIT WHEN _state.idle;
        _rows := '[]';
        _dead := false;
        FOR _i IN 1 .. cardinality(_names) LOOP
            _name := _names[_i];
            _mode := _modes[_i];
            SELECT _rows || coalesce(jsonb_agg(to_jsonb(x)), '[]'),
                   _dead OR coalesce(bool_or(x.kind = 'holder' AND NOT x.live), false)
            INTO _rows, _dead
            FROM ({d.render(queries.IN_THE_WAY)}) AS x;
        END LOOP;
        EXIT WHEN _refuse OR NOT _dead;
        {d.render(queries.RECLAIM_EXPIRE)};
        WITH gone AS ({d.render(queries.RECLAIM_DELETE)})
        SELECT array_agg(DISTINCT name), count(*) INTO _gone, _removed FROM gone;
        IF _removed > 0 THEN
            _reclaimed := true;
            {d.render(queries.COUNT_RECLAIMED)};
            PERFORM pg_notify('{notify}', n) FROM unnest(_gone) AS n;
        END IF;
    END LOOP;

    IF _rows = '[]' THEN
        IF _state.started <> _state.started_now THEN
            {move_on}
        END IF;
        WITH granted AS ({d.render(queries.INSERT_HOLDERS)})
        SELECT jsonb_object_agg(name, token) INTO _tokens FROM granted;
        IF _seq IS NOT NULL THEN
            {d.render(queries.DEQUEUE)};
        END IF;
        RETURN jsonb_build_object('status', 'granted', 'tokens', _tokens, 'reclaimed', _reclaimed);
    END IF;

    IF _enqueue THEN
        IF _seq IS NULL THEN
            _seq := nextval('{schema}.lw_queue_seq');
            {d.render(queries.INSERT_WAITERS)};
            IF NOT _reclaimed THEN
                -- Only queue entries were written: a crash may forget them (design
                -- note, "Durability"), so this commit need not wait for the disk.
                PERFORM set_config('synchronous_commit', 'off', true);
            END IF;
        END IF;
        IF (SELECT h.holds FROM ({d.render(queries.HOLDS_ANY)}) AS h) THEN
            PERFORM pg_advisory_xact_lock({key}, {GRAPH_KEY});
            SELECT coalesce(jsonb_agg(jsonb_build_array(e.src, e.dst)), '[]') INTO _edges
            FROM ({d.render(queries.DEADLOCK_EDGES)}) AS e;
            IF _edges <> '[]' THEN
                {d.render(queries.DEQUEUE)};
                PERFORM pg_notify('{notify}', n) FROM unnest(_names) AS n;
                RETURN jsonb_build_object('status', 'deadlock', 'edges', _edges);
            END IF;
        END IF;
    END IF;
    RETURN jsonb_build_object('status', 'blocked', 'rows', _rows, 'reclaimed', _reclaimed);
END
$fn$"""
    lock = f"""
CREATE OR REPLACE FUNCTION {schema}.lw_lock(
    _session text, _request text, _name text, _mode text,
    _enqueue boolean, _refuse boolean, _wait double precision, _relaxed boolean,
    OUT _token bigint, OUT _result jsonb)
{planner}
AS $fn$
DECLARE
    _now double precision;
    _names text[];
    _modes text[];
    _seq bigint;
BEGIN
    {relax}
    PERFORM pg_advisory_xact_lock({key}, {_bucket("_name")});
    _now := date_part('epoch', clock_timestamp());
    {d.render(queries.TAKE_IDLE)}
    INTO _token;
    IF _token IS NOT NULL THEN
        RETURN;
    END IF;
    _names := ARRAY[_name];
    _modes := ARRAY[_mode];
    IF _enqueue AND ({d.render(queries.BLOCKED_BY_LIVE)}) THEN
        -- Certainly blocked, by a live holder: queue, and let the waiter read what is in
        -- its way later, outside the name's lock (design note, "Acquire").
        _seq := nextval('{schema}.lw_queue_seq');
        {d.render(queries.INSERT_WAITERS)};
        PERFORM set_config('synchronous_commit', 'off', true);  -- only a queue entry
        _result := jsonb_build_object('status', 'blocked', 'seq', _seq);
    ELSE  -- the full algorithm decides
        _result := {schema}.lw_acquire(_session, _request, _names, _modes,
                                      _enqueue, _refuse, _wait, _relaxed);
    END IF;
END
$fn$"""
    grant = f"""
CREATE OR REPLACE FUNCTION {schema}.lw_grant(_released text[], _near text)
RETURNS text
{planner}
AS $fn$
DECLARE
    _now double precision;
    _candidate record;
    _session text;
    _request text;
    _seq bigint;
    _names text[];
    _modes text[];
    _name text;
    _mode text;
    _refuse boolean := false;  -- a dead holder in the way is for the waiter to judge
    _closed text[] := ARRAY[]::text[];
    _blocked boolean;
    _tokens bigint[];
    _i integer;
    _token bigint;
    _dequeued bigint;
    _pokes text;
    _holding record;
BEGIN
    _now := date_part('epoch', clock_timestamp());
    IF cardinality(_released) = 1 THEN
        _name := _released[1];
        {d.render(_GRANT_HEAD)};
    END IF;
    IF _request IS NOT NULL THEN  -- an exclusive holder under a cap of one: nobody else gets in
        {tell("_session", "_request || ' ' || _token")}
        IF NOT (SELECT w.waits FROM ({d.render(queries.WAITS_ANY)}) AS w) THEN
            RETURN _pokes;  -- no cycle to complete: see `HOLDING_WAITERS`
        END IF;
    ELSE
        _names := _released;
        FOR _candidate IN {d.render(queries.GRANT_CANDIDATES)} LOOP
            EXIT WHEN _released <@ _closed;
            _session := _candidate.session_id;
            _request := _candidate.request_id;
            _seq := _candidate.seq;
            SELECT array_agg(w.name), array_agg(w.mode) INTO _names, _modes
            FROM ({d.render(queries.WAITING_ITEMS)}) AS w;
            CONTINUE WHEN _names IS NULL;  -- dequeued since the candidates were read
            CONTINUE WHEN _names && _closed;  -- behind a waiter blocked there: blocked too
            -- Names of a multi-lock outside the released ones: their locks are taken out of
            -- order, so only if free at once; otherwise the request decides for itself.
            IF NOT coalesce((
                SELECT bool_and(pg_try_advisory_xact_lock({key}, k.bucket))
                FROM (SELECT DISTINCT {_bucket("n")} AS bucket
                      FROM unnest(_names) AS n WHERE n <> ALL(_released) ORDER BY 1) AS k), true)
            THEN
                {tell("_session", "_request")}
                CONTINUE;
            END IF;
            _blocked := false;
            FOR _i IN 1 .. cardinality(_names) LOOP
                _name := _names[_i];
                _mode := _modes[_i];
                IF EXISTS ({d.render(queries.IN_THE_WAY)}) THEN
                    _blocked := true;
                    IF _name = ANY(_released) THEN
                        _closed := _closed || _name;
                    END IF;
                    EXIT;
                END IF;
            END LOOP;
            CONTINUE WHEN _blocked;
            -- Dequeued first, granted only if that removed its rows (see _GRANT_HEAD).
            {d.render(queries.DEQUEUE)};
            GET DIAGNOSTICS _dequeued = ROW_COUNT;
            CONTINUE WHEN _dequeued = 0;
            {move_on}
            WITH granted AS ({d.render(queries.INSERT_HOLDERS)})
            SELECT array_agg(g.token) INTO _tokens FROM granted AS g;
            {tell("_session", one_token)}
        END LOOP;
    END IF;
    _names := _released;
    FOR _holding IN {d.render(queries.HOLDING_WAITERS)} LOOP
        {tell("_holding.session_id", "_holding.request_id")}
    END LOOP;
    RETURN _pokes;
END
$fn$"""
    release = f"""
CREATE OR REPLACE FUNCTION {schema}.lw_release(
    _session text, _request text, _names text[], _relaxed boolean, _near text,
    OUT _n bigint, OUT _pokes text)
{planner}
AS $fn$
BEGIN
    {relax}
    {lock_names("_names")}
    WITH gone AS ({d.render(queries.RELEASE)}) SELECT count(*) INTO _n FROM gone;
    IF _n < cardinality(_names) THEN
        -- An abandon (or a stamp that lost a lock). A request holding all its
        -- names has no queue entries: every grant removes them.
        {d.render(queries.DEQUEUE)};
    END IF;
    -- Holding the names' locks, no waiter can enqueue unseen between this check and the
    -- commit: the waiters the release lets in are granted here, in queue order, and only
    -- they are told; a release nobody waits for costs no more than its delete.
    IF EXISTS (SELECT 1 FROM {schema}.lw_waiters WHERE name = ANY(_names)) THEN
        _pokes := {schema}.lw_grant(_names, _near);
    END IF;
END
$fn$"""
    return [acquire, lock, grant, release]


def steps(schema: str) -> dict[int, list[str]]:
    """What PostgreSQL adds to each schema version besides the shared tables.

    Not the functions: they follow the library, not the schema version (`sync`).
    """
    return {
        1: [
            # CACHE 1 (the default) matters: with per-backend caches, tokens
            # handed out by two connections would not grow in grant order.
            f"CREATE SEQUENCE {schema}.lw_token_seq CACHE 1",
            f"CREATE SEQUENCE {schema}.lw_queue_seq CACHE 1",
        ],
    }


_HEAD = re.compile(r"FUNCTION (\S+?)\((.*?)\)\s*(?:RETURNS (\w+))?", re.S)
"""The name, the parameter list and the result type of a ``CREATE FUNCTION`` statement."""


def _signature(statement: str) -> tuple[str, str]:
    """``(name(in types), result type)`` of one of `functions`, as ``to_regprocedure`` reads it.

    OUT parameters are not part of a signature; a function with them returns ``record``.
    """
    found = _HEAD.search(statement)
    assert found is not None, "every statement of `functions` creates one function"
    name, parameters, result = found.groups()
    declared = [p.strip() for p in parameters.split(",")]
    types = [p.split(" ", 1)[1] for p in declared if not p.startswith("OUT ")]
    return f"{name}({', '.join(types)})", result or "record"


_READ_FINGERPRINT: Final = "SELECT value FROM {p}lw_meta WHERE key = 'functions'"
_WRITE_FINGERPRINT: Final = (
    "INSERT INTO {p}lw_meta (key, value) VALUES ('functions', :fingerprint)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
_STALE_FUNCTIONS: Final = r"""
SELECT CAST(CAST(p.oid AS regprocedure) AS text) AS signature
FROM pg_proc AS p
WHERE p.pronamespace = CAST(:schema AS regnamespace) AND p.proname LIKE 'lw\_%'
  AND NOT EXISTS (
      SELECT 1 FROM unnest(CAST(:signatures AS text[]), CAST(:results AS text[])) AS f(sig, res)
      WHERE to_regprocedure(f.sig) = p.oid AND to_regtype(f.res) = p.prorettype)
"""
"""Our functions (named ``lw_...``) in the schema that the library does not define as they are:
another signature (an old overload), or another result type (which ``CREATE OR REPLACE``
cannot change)."""


def fingerprint(schema: str) -> int:
    """A 64-bit digest of the function definitions this library runs (kept in ``lw_meta``)."""
    digest = hashlib.sha256("\n".join(functions(schema)).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def sync(run: Run, schema: str) -> None:
    """Make the schema's functions the library's, if its recorded fingerprint differs.

    Runs inside the migration lock on every connect, whatever the schema
    version: an upgrade that changes a function's text (or signature) must
    not leave a store on the old body while the Python side runs the new
    one. Old signatures of our functions are dropped, the current ones
    replaced in place (a call in flight elsewhere finishes on the old body;
    the next one runs the new), and the fingerprint recorded, all in the
    migration's transaction.
    """
    wanted = fingerprint(schema)
    rows = run(_READ_FINGERPRINT)
    if rows and rows[0]["value"] == wanted:
        return
    statements = functions(schema)
    signatures, results = zip(*map(_signature, statements), strict=True)
    stale = run(
        _STALE_FUNCTIONS,
        {"schema": schema, "signatures": list(signatures), "results": list(results)},
    )
    for row in stale:
        signature = row["signature"].replace("{", "{{").replace("}", "}}")
        run(f"DROP FUNCTION {signature}")
    for statement in statements:
        run(statement)
    run(_WRITE_FINGERPRINT, {"fingerprint": wanted})
