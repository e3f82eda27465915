"""Opening a store: `connect` (the URL's scheme picks the backend; each backend's
package is imported only when its scheme is used, so the command line on the default
SQLite store loads none of the others) and `check_schema`."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

from lockwarden.errors import LockUsageError
from lockwarden.store import bounds, validate
from lockwarden.store.backends.base import Backend, Opening
from lockwarden.store.backends.sql import schema
from lockwarden.store.backends.sql.base import NoStore, SQLBackend
from lockwarden.store.backends.sqlite import url as sqlite_url
from lockwarden.store.backends.sqlite.backend import SQLiteBackend
from lockwarden.store.store import Store
from lockwarden.store.url import StoreURL
from lockwarden.store.validate import shown

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")

_KEYWORD_FORM = re.compile(r"\s*[A-Za-z_]+\s*=")


_EXAMPLES = (
    "a file path, sqlite:////abs/path.db, postgresql://user@host:5432/db, "
    "etcd://host:2379,host2:2379/prefix or mysql://user@host:3306/db"
)


def parse_url(url: object) -> StoreURL:
    """Split and check a store URL; raise `LockUsageError` saying what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise LockUsageError(f"store URL must be a non-empty string: {_EXAMPLES}; got {shown(url)}")
    if "\x00" in url:
        raise LockUsageError("store URL has a NUL character (no file or host name has one)")
    scheme = _SCHEME.match(url)
    if scheme is None:
        if "://" in url:  # a URL without a usable scheme: not quoted, it may hold a password
            raise LockUsageError(f"store URL has no scheme before '://': use {_EXAMPLES}")
        if _KEYWORD_FORM.match(url):
            from lockwarden.store.backends.postgresql import url as postgresql_url  # noqa: PLC0415

            return postgresql_url.parse(url, keyword_form=True)
        return sqlite_url.parse_path(url, url)
    name = scheme.group(1).lower()
    if name in ("postgresql", "postgres") and url[scheme.end() :].startswith("//"):
        from lockwarden.store.backends.postgresql import url as postgresql_url  # noqa: PLC0415

        return postgresql_url.parse(url, keyword_form=False)
    if name == "sqlite" and url[scheme.end() :].startswith("//"):
        return sqlite_url.parse(url[scheme.end() + 2 :])
    if name in ("mysql", "mariadb") and url[scheme.end() :].startswith("//"):
        from lockwarden.store.backends.mysql import url as mysql_url  # noqa: PLC0415

        return mysql_url.parse(url)
    if name == "etcd" and url[scheme.end() :].startswith("//"):
        from lockwarden.store.backends.etcd import url as etcd_url  # noqa: PLC0415

        return etcd_url.parse(url[scheme.end() + 2 :])
    if name in ("postgresql", "postgres", "sqlite", "etcd", "mysql", "mariadb"):
        raise LockUsageError(f"write {name}:// (two slashes, then the host, or none): {_EXAMPLES}")
    # Only the scheme is quoted: the rest may hold a password we cannot find.
    raise LockUsageError(
        f"unsupported store URL scheme {scheme.group(1)!r}: use {_EXAMPLES} "
        "(a file whose name has a colon: write ./NAME)"
    )


def connect(
    url: str,
    max_hold: float | None = None,
    *,
    on_stale: str = "reclaim",
    lock_delay: float = 0.0,
    durability: str = "durable",
    create: bool = True,
    call_timeout: float = bounds.CALL_TIMEOUT,
) -> Store:
    """Open the lock store at ``url``, creating or upgrading its tables.

    ``url``: a file path (``/var/lib/app/locks.db``, ``./locks.db``) or
    ``sqlite:///relative.db`` / ``sqlite:////abs/path.db`` for SQLite (made
    absolute, and shown so); for PostgreSQL any connection string libpq
    takes — ``postgresql://user@host:port/db?schema=NAME``,
    ``postgresql:///db?host=/var/run/postgresql`` (a Unix socket), or
    ``host=... dbname=...`` — with the ``PG*`` environment and ``~/.pgpass``
    filling in what it leaves out; ``schema`` (default "lockwarden", URL form
    only) is lockwarden's own, every other parameter goes to libpq.
    ``etcd://host:port[,host:port...][/prefix]`` (default prefix "lockwarden") is an
    etcd cluster;
    ``mysql://user[:password]@host[:port]/db`` (also ``mariadb://``; options
    ``unix_socket``, ``ssl``, ``ssl_ca``, ``ssl_cert``, ``ssl_key``, ``connect_timeout``)
    a MySQL or MariaDB database.
    ``max_hold``: seconds; waiters fail with `HeldTooLong` behind a
    lock held longer (default None: no limit, as in the command line: a
    waiter without a timeout waits as long as the holder lives).
    ``on_stale``: the default policy for a dead holder's lock, "reclaim" or
    "refuse". ``lock_delay``: seconds a reclaimed lock is withheld from its
    new holder. ``durability``:
    "durable", or "relaxed" (PostgreSQL and SQLite: lock transactions do not
    wait for the disk; see the design note for what a crash of the database
    or of the machine then costs; fencing tokens never repeat either way).
    ``create=False``: a database without a lock store raises `StoreError`
    instead of getting one (an existing store is still upgraded).
    ``call_timeout``: seconds one call to the database may take, connecting
    and retries included (default 5), before it fails with `StoreError`:
    nothing waits on an unreachable database for longer (docs/operators.md,
    "Partitions"); a heartbeat waits no longer than its session's lease.
    """
    hold = validate.max_hold(max_hold)
    validate.on_stale(on_stale)
    delay = validate.duration(lock_delay, "lock_delay")
    bound = validate.duration(call_timeout, "call_timeout", zero=False)
    opening: Opening = "create" if create else "existing"
    backend = _backend(url, durability, opening, bound)
    return Store(
        backend,
        max_hold=hold,
        on_stale=on_stale,
        lock_delay=delay,
        reopen=partial(_backend, url, durability, opening, bound),
    )


def check_schema(url: str, *, call_timeout: float = bounds.CALL_TIMEOUT) -> schema.Plan:
    """What `connect` would do to the store's tables at ``url``, changing nothing."""
    bound = validate.duration(call_timeout, "call_timeout", zero=False)
    try:
        backend = _backend(url, "durable", "inspect", bound)
    except NoStore as exc:
        if exc.plan is None:
            raise
        return exc.plan
    backend.close()
    if not isinstance(backend, SQLBackend):
        raise LockUsageError(f"{backend.url.display} has no schema: its keys need no creating")
    return backend.plan


def _backend(url: str, durability: str, opening: Opening, call_timeout: float) -> Backend:
    parsed = parse_url(url)._replace(call_timeout=call_timeout)
    if durability not in ("durable", "relaxed"):
        raise LockUsageError(f"durability must be 'durable' or 'relaxed', got {durability!r}")
    if durability == "relaxed" and parsed.backend not in ("postgresql", "sqlite"):
        raise LockUsageError(
            "relaxed durability is for PostgreSQL and SQLite only: "
            f"every lock transaction on {parsed.backend} commits durably"
        )
    return _BACKENDS[parsed.backend](parsed, durability == "relaxed", opening)


def _postgres(url: StoreURL, relaxed: bool, opening: Opening) -> Backend:
    from lockwarden.store.backends.postgresql.backend import PostgresBackend  # noqa: PLC0415  (SQLite users skip it)

    return PostgresBackend(url, relaxed=relaxed, opening=opening)


def _mysql(url: StoreURL, relaxed: bool, opening: Opening) -> Backend:
    from lockwarden.store.backends.mysql.backend import MySQLBackend  # noqa: PLC0415  (its users alone pay)

    return MySQLBackend(url, opening=opening)


def _etcd(url: StoreURL, relaxed: bool, opening: Opening) -> Backend:
    try:  # an optional extra: only etcd users install its client
        from lockwarden.store.backends.etcd.backend import EtcdBackend  # noqa: PLC0415
    except ImportError as exc:
        raise LockUsageError(
            f"{url.display} needs the etcd client: pip install 'lockwarden[etcd]' ({exc})"
        ) from None
    return EtcdBackend(url)


_BACKENDS: dict[str, Callable[[StoreURL, bool, Opening], Backend]] = {
    "sqlite": lambda url, relaxed, opening: SQLiteBackend(url, relaxed=relaxed, opening=opening),
    "postgresql": _postgres,
    "etcd": _etcd,
    "mysql": _mysql,
}
"""Each URL scheme's backend, given the parsed URL, whether durability is relaxed, and
how to treat the store's tables (`SQLBackend._migrate`; an etcd store has none)."""
