"""The registers the workers increment under their locks, in the store's own database.

There is one register per lock name. A worker holding a name's write lock
reads the register and writes it back plus one; a reader reads it twice.
If the lock (with its fencing) works, the register ends equal to the number
of increments that were accepted, and every read sees exactly the writes of
older tokens.

`FencedRegisters` keep each register in a `Fence` (the store's fenced
register: an access with a token older than one already seen is refused).
`PlainRegisters` are a table read and written without any token: the
read-modify-write a program writes when it trusts its lock alone. The
control run (``--no-fencing``) uses them to show what the checker sees when
a paused holder writes after its lease ran out.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Protocol

import psycopg

from chaos.config import Config
from lockwarden import StoreError
from lockwarden.store import Fence, Store
from lockwarden.store.opening import parse_url


class Registers(Protocol):
    def read(self, name: str, token: int) -> int:
        """The register's value, read under the lock whose fencing token is ``token``."""

    def write(self, name: str, token: int, value: int) -> None:
        """Store ``value`` under the lock whose fencing token is ``token``."""

    def final(self, name: str) -> int:
        """The value after the run (nobody holds anything any more)."""


def registers_for(
    config: Config, store: Store, application_name: str = "chaos", url: str | None = None
) -> Registers:
    """The run's registers: fenced, or (``--no-fencing``) plain, on a connection named so,
    to ``url`` (a worker's, through its proxy) or the run's."""
    if config.fencing:
        return FencedRegisters(store)
    return PlainRegisters(url or config.url, application_name)


class FencedRegisters:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._fences: dict[str, Fence] = {}

    def _fence(self, name: str) -> Fence:
        if name not in self._fences:
            self._fences[name] = self._store.fence(f"register/{name}")
        return self._fences[name]

    def read(self, name: str, token: int) -> int:
        return int(self._fence(name).read(token) or 0)

    def write(self, name: str, token: int, value: int) -> None:
        self._fence(name).write(token, str(value))

    def final(self, name: str) -> int:
        return int(self._fence(name).state()[1] or 0)


class PlainRegisters:
    """Registers without fencing, on a connection of their own.

    Database errors become `StoreError`, as the store's own do, so that a
    worker treats both alike (the outcome of the statement is unknown).
    """

    def __init__(self, url: str, application_name: str = "chaos") -> None:
        self._url = parse_url(url)
        self._application_name = application_name
        self._table = (
            f"{self._url.schema}.chaos_registers" if self._url.schema else "chaos_registers"
        )
        self._conn: Any = None

    def create(self) -> None:
        self._execute(
            f"CREATE TABLE IF NOT EXISTS {self._table}"
            " (name TEXT PRIMARY KEY, value BIGINT NOT NULL)"
        )

    def read(self, name: str, token: int) -> int:
        rows = self._execute(f"SELECT value FROM {self._table} WHERE name = ?", (name,))
        return int(rows[0][0]) if rows else 0

    def write(self, name: str, token: int, value: int) -> None:
        self._execute(
            f"INSERT INTO {self._table} (name, value) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (name, value),
        )

    def final(self, name: str) -> int:
        return self.read(name, 0)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _execute(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            if self._conn is None:
                self._conn = self._connect()
            if self._url.backend == "postgresql":
                sql = sql.replace("?", "%s")
            cursor = self._conn.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []
        except (sqlite3.Error, psycopg.Error) as exc:
            self.close()
            raise StoreError(f"register table: {exc}") from exc

    def _connect(self) -> Any:
        if self._url.backend == "sqlite":
            conn = sqlite3.connect(self._url.target, timeout=10.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            return conn
        return psycopg.connect(
            self._url.target, autocommit=True, application_name=self._application_name
        )
