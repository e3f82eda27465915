"""The PostgreSQL functions that make acquire and release one round trip each (D15).

They run the algorithm of the design note with the shared statements of
`queries`, so the SQL a grant decision rests on is the same text that SQLite
runs. What is PostgreSQL's own: the advisory locks that serialize requests
for a name, the token sequence and its jump after a server restart (design
note, "Durability"), and NOTIFY.
"""

from __future__ import annotations

import zlib

from lockwarden.store import queries

BUCKETS = 1024
"""Names hash into this many advisory-lock keys per schema.

A request takes one transaction-level lock per distinct bucket of its names,
in bucket order (so two requests never deadlock on them). Bounding the
buckets bounds what a multi-lock of thousands of names takes from the
server's shared lock table; a collision only makes two names' acquires
queue behind each other for the length of one transaction.
"""


def lock_key(schema: str) -> int:
    """The first advisory-lock key of a schema: its stores never contend with another schema's."""
    return zlib.crc32(schema.encode()) - 2**31


def channel(schema: str) -> str:
    """The NOTIFY channel of a schema's store."""
    return f"lockwarden_{schema}"


# Second advisory-lock keys besides the name buckets (0 .. BUCKETS - 1).
GRAPH_KEY = -1
"""Serializes deadlock checks, so of two requests closing a cycle the second sees the first."""
MIGRATION_KEY = -2
"""Serializes schema migrations between processes."""


def functions(schema: str) -> list[str]:
    """``CREATE FUNCTION`` statements for a schema (part of its migration).

    A PL/pgSQL function pays for every statement it runs, so the common
    path is short: lock the names, read the state, insert the grant (or, for
    a release, delete it). Both run with generic plans, and without bitmap
    or sequential scans (design note, "Cost"). Whenever their text changes,
    the schema version that changes it re-creates them (`steps`).
    """
    d = queries.plpgsql(schema)
    key = lock_key(schema)
    notify = channel(schema)
    lock_names = f"""
    PERFORM pg_advisory_xact_lock({key}, k.bucket)
    FROM (SELECT DISTINCT (hashtextextended(n, 0) & {BUCKETS - 1})::integer AS bucket
          FROM unnest(_names) AS n ORDER BY 1) AS k;"""
    # How both functions are planned (design note, "Cost").
    planner = """LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_bitmapscan = off
SET enable_seqscan = off"""
    relax = """
    IF _relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
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
    _reclaimed boolean := false;
    _tokens jsonb;
    _edges jsonb;
BEGIN
    {relax}
    {lock_names}
    _now := date_part('epoch', clock_timestamp());
    SELECT * INTO _state FROM ({d.render(queries.ACQUIRE_STATE)}) AS st;
    IF _state.granted THEN  -- a retry of a request whose first attempt committed
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
        SELECT array_agg(DISTINCT name) INTO _gone FROM gone;
        IF _gone IS NOT NULL THEN
            _reclaimed := true;
            PERFORM pg_notify('{notify}', n) FROM unnest(_gone) AS n;
        END IF;
    END LOOP;

    IF _rows = '[]' THEN
        IF _state.started <> _state.started_now THEN
            -- The server restarted: tokens move on to the next 2^40 range, durably,
            -- so that none repeats one a crash may have forgotten ("Durability").
            UPDATE {schema}.lw_meta SET value = _state.started_now
            WHERE key = 'started' AND value <> _state.started_now;
            IF FOUND THEN
                PERFORM setval('{schema}.lw_token_seq',
                               ((last_value >> 40) + 1) << 40, false)
                FROM {schema}.lw_token_seq;
                PERFORM set_config('synchronous_commit', 'on', true);
            END IF;
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
    release = f"""
CREATE OR REPLACE FUNCTION {schema}.lw_release(
    _session text, _request text, _names text[], _relaxed boolean)
RETURNS bigint
{planner}
AS $fn$
DECLARE
    _n bigint;
BEGIN
    {relax}
    {lock_names}
    WITH gone AS ({d.render(queries.RELEASE)}), dequeued AS ({d.render(queries.DEQUEUE)})
    SELECT count(*) INTO _n FROM gone;
    -- Holding the names' locks, no waiter can enqueue unseen between this
    -- check and the commit, so a release nobody waits for costs no NOTIFY.
    IF EXISTS (SELECT 1 FROM {schema}.lw_waiters WHERE name = ANY(_names)) THEN
        PERFORM pg_notify('{notify}', n) FROM unnest(_names) AS n;
    END IF;
    RETURN _n;
END
$fn$"""
    return [acquire, release]


def steps(schema: str) -> dict[int, list[str]]:
    """What PostgreSQL adds to each schema version besides the shared tables."""
    return {
        1: [
            # CACHE 1 (the default) matters: with per-backend caches, tokens
            # handed out by two connections would not grow in grant order.
            f"CREATE SEQUENCE {schema}.lw_token_seq CACHE 1",
            f"CREATE SEQUENCE {schema}.lw_queue_seq CACHE 1",
            *functions(schema),
        ],
        # Version 3: the functions never plan a sequential scan (CREATE OR REPLACE).
        3: functions(schema),
    }
