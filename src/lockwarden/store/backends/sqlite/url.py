"""SQLite store URLs: a plain path, ``sqlite:///relative.db`` or ``sqlite:////abs.db``.

The path is made absolute here, and shown so, so that every message names the
file actually used whatever the working directory."""

from __future__ import annotations

import os

from lockwarden.errors import LockUsageError
from lockwarden.store.url import StoreURL, named_parameters


def parse(rest: str) -> StoreURL:
    """``sqlite://`` + rest: an empty host, then the path (relative after one slash)."""
    host, slash, path = rest.partition("/")
    if host:  # never quoted: a PostgreSQL URL given the wrong scheme carries a password there
        raise LockUsageError(
            "a SQLite URL names a host; SQLite files are local: write "
            "sqlite:///relative/path.db, sqlite:////absolute/path.db or just the path"
        )
    if "?" in path or "#" in path:  # names only: a value may be a password
        raise LockUsageError(
            f"a SQLite URL takes no parameters{named_parameters(path)}; a file whose name has "
            "'?' or '#': give the path alone"
        )
    if not slash:
        path = ""
    return parse_path(path, f"sqlite:///{path}")


def parse_path(path: str, given: str) -> StoreURL:
    if not path or path.endswith("/"):
        raise LockUsageError(f"{given!r} names no file: write sqlite:///path/to/locks.db")
    if path == ":memory:":
        raise LockUsageError(
            "an in-memory SQLite database cannot be shared between connections or "
            "processes: give a file path, e.g. sqlite:///locks.db"
        )
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise LockUsageError(f"SQLite path {path[:60]!r} is not valid Unicode") from None
    absolute = os.path.abspath(path)
    return StoreURL("sqlite", absolute, "", f"sqlite:///{absolute}")
