"""Store URLs: parsed and checked before anything touches a database.

Two forms are accepted (D1)::

    sqlite:///relative/path.db      sqlite:////absolute/path.db
    postgresql://user@host:port/db?schema=NAME

A bad URL is a `LockUsageError` naming what is wrong and what a good one
looks like. The URL shown in messages never carries the password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from lockwarden.errors import LockUsageError

DEFAULT_SCHEMA = "lockwarden"

# The schema name is spliced into DDL, function bodies and the NOTIFY channel
# name ("lockwarden_<schema>", at most 63 bytes), so it is a plain lower-case
# identifier that never needs quoting.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,51}")

_EXAMPLES = "sqlite:///relative.db, sqlite:////abs/path.db or postgresql://user@host:5432/db"


@dataclass(frozen=True)
class StoreURL:
    """Where a store lives, split into what each backend needs."""

    backend: str
    """"sqlite" or "postgresql"."""
    target: str
    """The SQLite file path, or the libpq connection URL (without ``schema``)."""
    schema: str
    """The PostgreSQL schema holding the store's tables ("" on SQLite)."""
    display: str
    """The URL for messages: everything but the password."""


def parse_url(url: object) -> StoreURL:
    """Split and check a store URL; raise `LockUsageError` saying what is wrong."""
    if not isinstance(url, str) or not url:
        raise LockUsageError(f"store URL must be a non-empty string like {_EXAMPLES}; got {url!r}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # not quoted: it may hold a password we cannot find
        raise LockUsageError(f"store URL is malformed ({exc}): use {_EXAMPLES}") from None
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        return _sqlite(url, parts.netloc, parts.path, parts.query)
    if scheme in ("postgresql", "postgres"):
        return _postgres(url)
    raise LockUsageError(
        f"unsupported store URL scheme {parts.scheme!r} in {_redact(url)!r}: use {_EXAMPLES}"
    )


def _sqlite(url: str, netloc: str, path: str, query: str) -> StoreURL:
    shown = _redact(url)  # a PostgreSQL URL given the wrong scheme may carry a password
    if netloc:
        raise LockUsageError(
            f"SQLite URL {shown!r} names a host ({urlsplit(shown).netloc!r}); SQLite files "
            "are local: write sqlite:///relative/path.db or sqlite:////absolute/path.db"
        )
    if query:
        keys = [key for key, _ in parse_qsl(query, keep_blank_values=True) if key]
        raise LockUsageError(  # names only: a value may be a password
            f"SQLite URL {shown!r} takes no parameters (found {', '.join(keys) or 'some'})"
        )
    file = path[1:]  # "sqlite:///x" has path "/x": the third slash only ends the empty host
    if not file or file.endswith("/"):
        raise LockUsageError(
            f"SQLite URL {shown!r} names no file: write sqlite:///path/to/locks.db"
        )
    if "\x00" in file:
        raise LockUsageError(f"SQLite URL {shown!r} has a NUL character in its file name")
    if file == ":memory:":
        raise LockUsageError(
            "an in-memory SQLite database cannot be shared between connections or "
            "processes: give a file path, e.g. sqlite:///locks.db"
        )
    return StoreURL("sqlite", file, "", url)


def _postgres(url: str) -> StoreURL:
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in params if key == "schema"]
    rest = [(key, value) for key, value in params if key != "schema"]
    if len(schemas) > 1:
        raise LockUsageError(f"PostgreSQL URL {_redact(url)!r} gives schema= more than once")
    schema = schemas[0] if schemas else DEFAULT_SCHEMA
    if not _SCHEMA_NAME.fullmatch(schema):
        raise LockUsageError(
            f"schema {schema!r} in {_redact(url)!r} is not a plain identifier: use 1 to 52 "
            "lower-case letters, digits and underscores, starting with a letter or underscore"
        )
    if not any(key == "connect_timeout" for key, _ in rest):
        rest.append(("connect_timeout", "10"))  # libpq waits forever for a silent host
    # quote, not urlencode's default quote_plus: libpq reads "+" as a plus, not a space.
    target = urlunsplit(
        (parts.scheme, parts.netloc, parts.path, urlencode(rest, quote_via=quote), "")
    )
    return StoreURL("postgresql", target, schema, _redact(url))


def _secret(key: str) -> bool:
    """A parameter never shown: password, and libpq's sslpassword (or any misspelling)."""
    return "password" in key.lower()


def _redact(url: str) -> str:
    """The URL without its password (in the user part or as a parameter) and without a
    fragment (which the store ignores, and which may hold anything); as given otherwise."""
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    if parts.password is None and not any(_secret(key) for key, _ in params) and not parts.fragment:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        user = quote(parts.username or "", safe="")
        host = netloc.rpartition("@")[2]
        netloc = f"{user}@{host}"
    query = urlencode([(k, v) for k, v in params if not _secret(k)], quote_via=quote)
    # Written out: urlunsplit drops the "//" of an empty host for schemes it does not know.
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
