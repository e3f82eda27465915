"""Migrations: tables created once, the version recorded, a newer database refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import lockwarden
from lockwarden import StoreError
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
