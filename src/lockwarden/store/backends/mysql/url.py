"""MySQL and MariaDB store URLs: ``mysql://user[:password]@host[:port]/db?option=...``
(also ``mariadb://``); `mysql_options` turns one into the driver's arguments."""

from __future__ import annotations

from typing import Final

from lockwarden.errors import LockUsageError
from lockwarden.store.url import StoreURL, redact_url

_MYSQL_OPTIONS: Final = {
    "unix_socket": str,
    "charset": str,
    "connect_timeout": int,
    "ssl": bool,
    "ssl_ca": str,
    "ssl_cert": str,
    "ssl_key": str,
}
"""The parameters a MySQL URL may carry (anything else is a typo, refused)."""


def parse(url: str) -> StoreURL:
    """``mysql://user[:password]@host[:port]/db?option=...`` (also ``mariadb://``).

    The database holds the store's tables, as a schema does on PostgreSQL.
    """
    mysql_options(url)  # every check happens here, before any connection
    return StoreURL("mysql", url, "", redact_url(url))


def mysql_options(url: str) -> dict[str, object]:
    """The driver's connection arguments for a MySQL URL; `LockUsageError` if any is bad."""
    from urllib.parse import parse_qsl, unquote, urlsplit  # noqa: PLC0415  (SQLite's start skips it)

    userinfo = url.partition("://")[2].rpartition("@")[0]
    if any(c in userinfo for c in "/?#"):  # not quoted: where the password ends is unclear
        raise LockUsageError(
            "MySQL URL has a '/', '?' or '#' in its user name or password (or an '@' after "
            "it): percent-encode them (%2F, %3F, %23, %40); the URL is not shown, as it may "
            "hold a password"
        )
    try:
        parts = urlsplit(url)
    except ValueError:  # not quoted: the URL may hold a password
        raise LockUsageError(
            "MySQL URL has a malformed host (an unclosed '[' of an IPv6 address?): "
            "write mysql://user@host:3306/db or mysql://user@[::1]:3306/db"
        ) from None
    shown = redact_url(url)
    database = unquote(parts.path[1:])
    if not database or "/" in database:
        raise LockUsageError(
            f"MySQL URL {shown!r} must name one database: mysql://user@host:3306/DB"
        )
    if not parts.username:
        raise LockUsageError(f"MySQL URL {shown!r} names no user: mysql://USER@host/db")
    try:
        port = parts.port
    except ValueError:
        raise LockUsageError(f"MySQL URL {shown!r} has a bad port number") from None
    found: dict[str, object] = {
        "user": unquote(parts.username),
        "password": unquote(parts.password or ""),
        "host": parts.hostname or "localhost",
        "port": port or 3306,
        "database": database,
        "connect_timeout": 10,  # the driver would wait forever for a silent host
    }
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        kind = _MYSQL_OPTIONS.get(key)
        if kind is None:
            raise LockUsageError(  # the name only: a value may be a secret
                f"MySQL URL {shown.partition('?')[0]!r} has an unknown parameter {key!r} "
                f"(its value not shown): the known ones are {', '.join(_MYSQL_OPTIONS)}"
            )
        if kind is int:
            if not value.isdigit() or int(value) == 0:
                raise LockUsageError(f"{key} in {shown!r} must be a positive whole number")
            found[key] = int(value)
        elif kind is bool:
            if value.lower() not in ("1", "true", "0", "false"):
                raise LockUsageError(f"{key} in {shown!r} must be true or false")
            found[key] = value.lower() in ("1", "true")
        else:
            found[key] = value
    if found.get("charset", "utf8mb4") != "utf8mb4":
        raise LockUsageError(
            f"charset in {shown!r} must be utf8mb4 (or left out): lock names are any "
            "Unicode text, which other character sets cannot carry"
        )
    return found
