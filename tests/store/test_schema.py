"""Migrations: tables created once, the version recorded, a newer database refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import lockwarden
from lockwarden import LockLost, StoreError
from lockwarden.store import Store, schema


def test_a_new_database_gets_the_current_version(store: Store) -> None:
    rows = store._backend.query(schema.READ_VERSION)
    assert rows == [{"value": schema.SCHEMA_VERSION}]


def test_reconnecting_keeps_the_data(url: str, connect: Callable[..., Store]) -> None:
    first = connect()
    with first.session(app_id="a") as s:
        held = s.lock("kept")
        second = connect()  # migrates nothing, sees the lock
        assert [e.token for e in second.locks()] == [held.token]


def test_a_newer_schema_is_refused(url: str, connect: Callable[..., Store]) -> None:
    store = connect()
    store._backend.query(schema.WRITE_VERSION, {"version": schema.SCHEMA_VERSION + 1}, write=True)
    with pytest.raises(StoreError, match="newer than this lockwarden"):
        lockwarden.connect(url)


def test_version_1_fences_keep_their_strictness_after_the_upgrade(
    url: str, connect: Callable[..., Store]
) -> None:
    """Version 2 remembers the last write's token apart; a version 1 row did not, so the
    upgrade takes its highest admitted token for it (refusing at least what it did)."""
    store = connect()
    fence = store.fence("old")
    fence.write(5, "v5")
    fence.admit(9)
    for downgrade in ("ALTER TABLE {p}lw_fences DROP COLUMN written", schema.WRITE_VERSION):
        store._backend.query(downgrade, {"version": 1}, write=True)
    upgraded = connect().fence("old")
    with pytest.raises(LockLost):
        upgraded.read(8)
    assert upgraded.read(9) == "v5"
    assert store._backend.query(schema.READ_VERSION) == [{"value": schema.SCHEMA_VERSION}]
