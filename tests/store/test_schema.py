"""Migrations: tables created once, the version recorded, a newer database refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import lockwarden
from lockwarden import LockLost, StoreError
from lockwarden.store import Store, check_schema
from lockwarden.store.backends.sql import queries, schema
from tests.conftest import URLS


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    """Schema versions are the SQL backends': an etcd store has no tables to migrate."""
    value: str = request.getfixturevalue(URLS[request.param])
    return value


def test_a_new_database_gets_the_current_version(store: Store) -> None:
    rows = store._backend.query(schema.READ_VERSION)
    assert rows == [{"value": schema.SCHEMA_VERSION}]


def test_reconnecting_keeps_the_data(url: str, connect: Callable[..., Store]) -> None:
    first = connect()
    with first.session(app_id="a") as s:
        held = s.lock("kept")
        second = connect()  # migrates nothing, sees the lock
        assert [e.token for e in second.locks()] == [held.token]


def _pretend_newer(store: Store, compatible_from: int) -> None:
    """Record a version one step ahead of this lockwarden, as a newer client would."""
    store._backend.query(schema.WRITE_VERSION, {"version": schema.SCHEMA_VERSION + 1}, write=True)
    store._backend.query(
        schema.WRITE_COMPATIBLE_FROM, {"compatible_from": compatible_from}, write=True
    )


def test_a_newer_schema_that_older_clients_cannot_use_is_refused(
    url: str, connect: Callable[..., Store]
) -> None:
    _pretend_newer(connect(), compatible_from=schema.SCHEMA_VERSION + 1)
    with pytest.raises(StoreError, match="cannot use safely"):
        lockwarden.connect(url)


def test_a_newer_schema_made_by_additive_steps_is_used_as_it_is(
    url: str, connect: Callable[..., Store]
) -> None:
    """A rolling upgrade: the first upgraded host adds, say, an index; the others carry on."""
    _pretend_newer(connect(), compatible_from=schema.SCHEMA_VERSION)
    older = connect()
    with older.session(app_id="old") as s:
        assert s.lock("still-works").token >= 1
    assert older._backend.query(schema.READ_VERSION) == [{"value": schema.SCHEMA_VERSION + 1}]


def test_every_version_records_who_may_use_it(store: Store) -> None:
    rows = store._backend.query(schema.READ_META)
    assert {r["key"]: r["value"] for r in rows} == {
        "schema_version": schema.SCHEMA_VERSION,
        "compatible_from": schema.compatible_from(schema.SCHEMA_VERSION),
    }
    assert all(1 <= schema.compatible_from(v) <= v for v in range(1, schema.SCHEMA_VERSION + 1))


def test_without_create_a_missing_store_is_refused_and_not_made(url: str) -> None:
    with pytest.raises(StoreError, match=r"no lock store at .*lockwarden init"):
        lockwarden.connect(url, create=False)
    plan = check_schema(url)  # still nothing there
    assert plan.found is None
    assert [v for v, _ in plan.steps] == list(range(1, schema.SCHEMA_VERSION + 1))


def test_without_create_an_existing_store_opens(url: str, connect: Callable[..., Store]) -> None:
    connect()
    with lockwarden.connect(url, create=False) as store:
        assert store.locks() == []


def test_check_schema_says_what_an_upgrade_would_do_and_does_nothing(
    url: str, connect: Callable[..., Store]
) -> None:
    store = connect()
    store._backend.query(schema.WRITE_VERSION, {"version": 2}, write=True)
    plan = check_schema(url)
    assert (plan.found, plan.refusal) == (2, None)
    assert [v for v, _ in plan.steps] == list(range(3, schema.SCHEMA_VERSION + 1))
    assert any("lw_holders_request" in sql for sql in plan.steps[0][1])
    assert store._backend.query(schema.READ_VERSION) == [{"value": 2}]


def test_version_1_fences_keep_their_strictness_after_the_upgrade(
    url: str, connect: Callable[..., Store]
) -> None:
    """Version 2 remembers the last write's token apart; a version 1 row did not, so the
    upgrade takes its highest admitted token for it (refusing at least what it did)."""
    store = connect()
    fence = store.fence("old")
    fence.write(5, "v5")
    fence.admit(9)
    for downgrade in (
        "ALTER TABLE {p}lw_fences DROP COLUMN written",
        "ALTER TABLE {p}lw_sessions DROP COLUMN pid_start",
        "DROP TABLE {p}lw_admin",
        schema.WRITE_VERSION,
    ):
        store._backend.query(downgrade, {"version": 1}, write=True)
    upgraded = connect().fence("old")
    with pytest.raises(LockLost):
        upgraded.read(8)
    assert upgraded.read(9) == "v5"
    assert store._backend.query(schema.READ_VERSION) == [{"value": schema.SCHEMA_VERSION}]


def test_an_older_client_leaves_a_newer_stores_functions_alone(pg_url: str) -> None:
    """On a newer store it may use, a client does not write back its own (older) PL/pgSQL:
    the newer clients sharing the store would run the older bodies from then on."""
    with lockwarden.connect(pg_url) as store:
        _pretend_newer(store, compatible_from=schema.SCHEMA_VERSION)
        newer = "UPDATE {p}lw_meta SET value = 42 WHERE key = 'functions'"
        store._backend.query(newer, write=True)
    with lockwarden.connect(pg_url) as older:
        rows = older._backend.query("SELECT value FROM {p}lw_meta WHERE key = 'functions'")
        assert rows == [{"value": 42}]


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"])
def test_version_7_starts_the_reclaim_count_at_0_and_can_run_again(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """The count's row comes with version 7, at 0, beside the data of before; a step run
    again (MySQL commits each statement: an upgrade cut short is finished by the next)
    keeps what was counted."""
    url = request.getfixturevalue(URLS[backend])
    with lockwarden.connect(url) as store, store.session(app_id="kept") as s:
        held = s.lock("kept")
        for downgrade in ("DELETE FROM {p}lw_meta WHERE key = 'reclaimed'", schema.WRITE_VERSION):
            store._backend.query(downgrade, {"version": 6}, write=True)
        assert store.reclaimed_count() == 0
        with lockwarden.connect(url) as upgraded:
            assert [e.token for e in upgraded.locks()] == [held.token]
            assert upgraded.reclaimed_count() == 0
            assert upgraded._backend.query(schema.READ_VERSION) == [
                {"value": schema.SCHEMA_VERSION}
            ]
        store._backend.query(queries.COUNT_RECLAIMED, {"removed": 2}, write=True)
        store._backend.query(schema.WRITE_VERSION, {"version": 6}, write=True)
        with lockwarden.connect(url) as again:
            assert again.reclaimed_count() == 2
            assert again._backend.query(schema.READ_VERSION) == [{"value": schema.SCHEMA_VERSION}]


_INDEXES = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'lw_holders'"
    " AND name NOT LIKE 'sqlite_autoindex%'",
    "postgres": "SELECT indexname AS name FROM pg_indexes WHERE schemaname = :schema"
    " AND tablename = 'lw_holders' AND indexname <> 'lw_holders_pkey'",
    "mysql": "SELECT DISTINCT index_name AS name FROM information_schema.statistics"
    " WHERE table_schema = DATABASE() AND table_name = 'lw_holders' AND index_name <> 'PRIMARY'",
}


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"])
def test_version_8_keeps_the_locks_and_one_index_and_can_run_again(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """The upgrade rebuilds SQLite's table and drops two indexes for one: the locks held
    stay held, release normally, and tokens go on growing (SQLite's counter trigger is
    made again with the table)."""
    url = request.getfixturevalue(URLS[backend])
    with lockwarden.connect(url) as store, store.session(app_id="kept") as s:
        held = [s.lock("kept"), s.lock("also", "read")]
        for shape in (
            "CREATE INDEX lw_holders_session ON {p}lw_holders (session_id)",
            "CREATE INDEX lw_holders_request ON {p}lw_holders (request_id, session_id)",
        ):
            store._backend.query(shape, write=True)
        for _ in range(2):  # and again, as after an upgrade cut short
            store._backend.query(schema.WRITE_VERSION, {"version": 7}, write=True)
            with lockwarden.connect(url) as upgraded:
                assert sorted(e.token for e in upgraded.locks()) == sorted(h.token for h in held)
                indexes = upgraded._backend.query(
                    _INDEXES[backend], {"schema": getattr(upgraded._backend.url, "schema", None)}
                )
                assert [r["name"].lower() for r in indexes] == ["lw_holders_owner"]
                assert upgraded._backend.query(schema.READ_VERSION) == [
                    {"value": schema.SCHEMA_VERSION}
                ]
        later = s.lock("later")
        assert later.token > max(h.token for h in held)
        for h in [*held, later]:
            h.release()
        assert store.locks() == []
