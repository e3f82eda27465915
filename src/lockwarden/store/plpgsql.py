"""The PostgreSQL functions that make acquire and release one round trip each (D15).

They run the algorithm of the design note with the shared statements of
`queries`, so the SQL a grant decision rests on is the same text that SQLite
runs. What is PostgreSQL's own: the per-name advisory locks that serialize
requests for a name, the token sequence with its epoch (design note,
"Durability"), and NOTIFY.
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
    """``CREATE FUNCTION`` statements for a schema (part of its migration)."""
    d = queries.plpgsql(schema)
    key = lock_key(schema)
    notify = channel(schema)
    lock_names = f"""
    PERFORM pg_advisory_xact_lock({key}, k.bucket)
    FROM (SELECT DISTINCT (hashtextextended(n, 0) & {BUCKETS - 1})::integer AS bucket
          FROM unnest(_names) AS n ORDER BY 1) AS k;"""
    relax = """
    IF _relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;"""
    acquire = f"""
CREATE OR REPLACE FUNCTION {schema}.lw_acquire(
    _session text, _request text, _names text[], _modes text[],
    _enqueue boolean, _refuse boolean, _wait double precision, _relaxed boolean)
RETURNS jsonb
LANGUAGE plpgsql
AS $fn$
DECLARE
    _now double precision;
    _state record;
    _seq bigint;
    _i integer;
    _name text;
    _mode text;
    _found jsonb;
    _dead boolean;
    _n bigint;
    _rows jsonb := '[]';
    _reclaimed boolean := false;
    _epoch bigint;
    _epoch_started bigint;
    _started bigint;
    _token bigint;
    _tokens jsonb := '[]';
    _edges jsonb;
BEGIN
    {relax}
    {lock_names}
    _now := date_part('epoch', clock_timestamp());
    SELECT * INTO _state FROM ({d.render(queries.ACQUIRE_STATE)}) AS st;
    IF _state.granted THEN  -- a retry of a request whose first attempt committed
        SELECT jsonb_agg(g.token ORDER BY array_position(_names, g.name)) INTO _tokens
        FROM ({d.render(queries.GRANTED)}) AS g;
        RETURN jsonb_build_object('status', 'granted', 'tokens', _tokens);
    END IF;
    IF NOT coalesce(_state.live, false) THEN
        RETURN jsonb_build_object('status', 'lost');
    END IF;
    _seq := _state.seq;

    FOR _i IN 1 .. cardinality(_names) LOOP
        _name := _names[_i];
        _mode := _modes[_i];
        LOOP
            SELECT coalesce(jsonb_agg(to_jsonb(x) || jsonb_build_object('name', _name)), '[]'),
                   coalesce(bool_or(x.kind = 'holder' AND NOT x.live AND NOT _refuse), false)
            INTO _found, _dead
            FROM ({d.render(queries.IN_THE_WAY)}) AS x;
            EXIT WHEN NOT _dead;
            {d.render(queries.RECLAIM_EXPIRE)};
            WITH gone AS ({d.render(queries.RECLAIM_DELETE)}) SELECT count(*) INTO _n FROM gone;
            IF _n > 0 THEN
                _reclaimed := true;
                PERFORM pg_notify('{notify}', _name);
            END IF;
        END LOOP;
        _rows := _rows || _found;
    END LOOP;

    IF jsonb_array_length(_rows) = 0 THEN
        -- The epoch moves on when the server restarted (design note, "Durability").
        _started := (date_part('epoch', pg_postmaster_start_time()) * 1000000)::bigint;
        SELECT max(value) FILTER (WHERE key = 'epoch'),
               max(value) FILTER (WHERE key = 'epoch_started')
        INTO _epoch, _epoch_started
        FROM {schema}.lw_meta WHERE key IN ('epoch', 'epoch_started');
        IF _epoch_started <> _started THEN
            UPDATE {schema}.lw_meta SET value = _started
            WHERE key = 'epoch_started' AND value <> _started;
            IF FOUND THEN
                UPDATE {schema}.lw_meta SET value = value + 1 WHERE key = 'epoch';
                PERFORM set_config('synchronous_commit', 'on', true);
            END IF;
            SELECT value INTO _epoch FROM {schema}.lw_meta WHERE key = 'epoch';
        END IF;
        FOR _i IN 1 .. cardinality(_names) LOOP
            _name := _names[_i];
            _mode := _modes[_i];
            _token := (_epoch << 40) | nextval('{schema}.lw_token_seq');
            {d.render(queries.INSERT_HOLDER)};
            _tokens := _tokens || to_jsonb(_token);
        END LOOP;
        IF _seq IS NOT NULL THEN
            {d.render(queries.DEQUEUE)};
        END IF;
        RETURN jsonb_build_object('status', 'granted', 'tokens', _tokens, 'reclaimed', _reclaimed);
    END IF;

    IF _enqueue THEN
        IF _seq IS NULL THEN
            _seq := nextval('{schema}.lw_queue_seq');
            FOR _i IN 1 .. cardinality(_names) LOOP
                _name := _names[_i];
                _mode := _modes[_i];
                {d.render(queries.INSERT_WAITER)};
            END LOOP;
        END IF;
        IF (SELECT h.holds FROM ({d.render(queries.HOLDS_ANY)}) AS h) THEN
            PERFORM pg_advisory_xact_lock({key}, {GRAPH_KEY});
            SELECT coalesce(jsonb_agg(jsonb_build_array(e.src, e.dst)), '[]') INTO _edges
            FROM ({d.render(queries.DEADLOCK_EDGES)}) AS e;
            IF jsonb_array_length(_edges) > 0 THEN
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
LANGUAGE plpgsql
AS $fn$
DECLARE
    _n bigint;
BEGIN
    {relax}
    {lock_names}
    WITH gone AS ({d.render(queries.RELEASE)}) SELECT count(*) INTO _n FROM gone;
    {d.render(queries.DEQUEUE)};
    -- Holding the names' locks, no waiter can enqueue unseen between this
    -- check and the commit, so a release nobody waits for costs no NOTIFY.
    PERFORM pg_notify('{notify}', n) FROM unnest(_names) AS n
    WHERE EXISTS (SELECT 1 FROM {schema}.lw_waiters AS w WHERE w.name = n);
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
            f"INSERT INTO {schema}.lw_meta (key, value) VALUES ('epoch', 0), ('epoch_started',"
            " (date_part('epoch', pg_postmaster_start_time()) * 1000000)::bigint)",
            *functions(schema),
        ]
    }
