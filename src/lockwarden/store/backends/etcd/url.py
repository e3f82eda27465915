"""etcd store URLs: ``etcd://host:port[,host:port...][/prefix]``."""

from __future__ import annotations

import re

from lockwarden.errors import LockUsageError
from lockwarden.store.url import DEFAULT_SCHEMA, StoreURL, named_parameters

# An etcd key prefix: every key of the store starts with "<prefix>/".
_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


_ENDPOINT = re.compile(r"(?P<host>[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")


def parse(rest: str) -> StoreURL:
    """``etcd://`` + rest: endpoints, then an optional key prefix."""
    netloc, _, prefix = rest.partition("/")
    if "@" in netloc or "?" in rest or "#" in rest:  # not quoted: it may hold a password
        named = "" if "@" in netloc else named_parameters(rest)  # a "?" may be a password's
        raise LockUsageError(
            f"an etcd URL takes no user, password or parameters{named}: write "
            "etcd://host:port[,host:port...][/prefix]"
        )
    shown = f"etcd://{rest}"
    for endpoint in netloc.split(","):
        match = _ENDPOINT.fullmatch(endpoint)
        if match is None or not 0 < int(match["port"]) < 65536:
            raise LockUsageError(
                f"etcd URL {shown!r}: endpoint {endpoint!r} is not host:port "
                "(e.g. etcd://10.0.0.1:2379,10.0.0.2:2379/locks)"
            )
    prefix = prefix or DEFAULT_SCHEMA
    if not _PREFIX.fullmatch(prefix):
        raise LockUsageError(
            f"etcd key prefix {prefix!r} in {shown!r} is not plain: use 1 to 100 letters, "
            "digits, '_', '.' and '-', starting with a letter, digit or '_'"
        )
    return StoreURL("etcd", netloc, prefix, shown)
