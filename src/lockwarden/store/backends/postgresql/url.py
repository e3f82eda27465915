"""PostgreSQL connection strings: ``postgresql://user@host:port/db?schema=NAME`` or libpq's
keyword/value form (``host=... dbname=...``; the default schema).

They go to libpq exactly as given, less our own ``schema`` parameter: psycopg's
`conninfo_to_dict` (libpq's own parser) reads them, so whatever psql accepts works,
and what the string leaves out comes from the ``PG*`` environment and ``~/.pgpass``
as libpq decides (``postgresql:///db?host=/var/run/postgresql`` is a local socket).

Secrets are found by the same parser: the password (and ``sslpassword``) libpq
read, in the form it appears in the string and percent-decoded, is what
`StoreURL.redact` removes from any text shown — the driver's messages included.
libpq's own parse errors quote the string, so they are never shown; a URL libpq
would split somewhere unexpected (an unencoded ``/`` or ``@`` in a password makes
it read part of the password as host or port) is refused before any connection is
tried."""

from __future__ import annotations

import os
import re
from typing import Any, Final

from lockwarden.errors import LockUsageError, StoreError
from lockwarden.store.url import DEFAULT_SCHEMA, StoreURL

# The schema name is spliced into DDL, function bodies and the NOTIFY channel
# name ("lockwarden_<schema>", at most 63 bytes), so it is a plain lower-case
# identifier that never needs quoting: not a keyword PostgreSQL reserves in any
# role (`_KEYWORDS`), and not the "pg_" prefix it keeps for system schemas.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,51}")


_KEYWORDS = frozenset(
    """
    all analyse analyze and any array as asc asymmetric authorization between bigint binary
    bit boolean both case cast char character check coalesce collate collation column
    concurrently constraint create cross current_catalog current_date current_role
    current_schema current_time current_timestamp current_user dec decimal default deferrable
    desc distinct do else end except exists extract false fetch float for foreign freeze from
    full grant greatest group grouping having ilike in initially inner inout int integer
    intersect interval into is isnull join lateral leading least left like limit localtime
    localtimestamp national natural nchar none normalize not notnull null nullif numeric
    offset on only or order out outer overlaps overlay placing position precision primary
    real references returning right row select session_user setof similar smallint some
    substring symmetric table tablesample then time timestamp to trailing treat trim true
    union unique user using values varchar variadic verbose when where window with
    xmlattributes xmlconcat xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi
    xmlroot xmlserialize xmltable
    """.split()  # noqa: SIM905  (read as the server prints it)
)
"""PostgreSQL's keywords that are not unreserved (``pg_get_keywords()``, catcode other
than 'U'): as an unquoted schema name each is a syntax error somewhere in our DDL.
A test compares this list with the server's."""


_SECRET_KEYS = ("password", "sslpassword")
"""libpq's parameters that hold secrets."""


_DEFAULTS = {
    "connect_timeout": ("PGCONNECT_TIMEOUT", "10"),
    "application_name": ("PGAPPNAME", "lockwarden"),
    "keepalives_idle": ("", "5"),
    "keepalives_interval": ("", "2"),
    "keepalives_count": ("", "3"),
    "tcp_user_timeout": ("", "10000"),
}
"""Parameters set unless the string or libpq's environment variable gives them:
libpq waits forever for a silent host; "lockwarden" names the connections in
pg_stat_activity; an idle connection (the LISTEN one) finds a peer that went
silent in about 11 s rather than the system's two hours, and data unacknowledged
for 10 s ends a connection (every call is bounded by the store's call timeout
anyway: `bounds`)."""


def import_psycopg() -> Any:
    """The psycopg module (an optional dependency), or a `StoreError` saying how to get it."""
    try:
        import psycopg  # noqa: PLC0415
        import psycopg.conninfo  # noqa: PLC0415
    except ImportError as exc:
        raise StoreError(
            "PostgreSQL stores need the psycopg driver: pip install 'lockwarden[postgres]'"
        ) from exc
    return psycopg


def parse(url: str, *, keyword_form: bool) -> StoreURL:
    psycopg = import_psycopg()
    conninfo_to_dict, make_conninfo = (
        psycopg.conninfo.conninfo_to_dict,
        psycopg.conninfo.make_conninfo,
    )

    raw: tuple[str, ...] = ()
    schema: str | None = None
    if keyword_form:  # which takes no schema: libpq refuses an unknown keyword
        rest, display = url, ""
    else:
        rest, schema, raw, display = _split_uri(url)
    try:
        params = {key: str(value) for key, value in conninfo_to_dict(rest).items()}
    except psycopg.Error:  # libpq's message quotes the string, password and all: never shown
        if not keyword_form and (unknown := _unknown_to_libpq(psycopg, rest)):
            common = [k for k in _COMMON_LIBPQ if k in _libpq_keywords(psycopg)]
            raise LockUsageError(
                f"the PostgreSQL URL has an unknown parameter {unknown!r} (its value not "
                "shown): the known ones are schema (lockwarden's) and libpq's connection "
                f"parameters ({', '.join(common)}, and the others libpq documents)"
            ) from None
        raise LockUsageError(
            "libpq cannot parse the PostgreSQL connection string (not shown: it may hold a "
            "password). In a URL, percent-encode reserved characters in the user name and "
            "password ('%' as %25, '/' as %2F, '@' as %40, ' ' as %20, '?' as %3F, '#' as %23); "
            "in the keyword form, quote values with spaces (password='a b'), and name a schema "
            "only in the URL form (?schema=NAME)"
        ) from None
    found = [params[key] for key in _SECRET_KEYS if params.get(key)]
    escaped = [s.replace("\\", "\\\\").replace("'", "\\'") for s in found]
    secrets = tuple(sorted({*raw, *found, *escaped} - {""}, key=len, reverse=True))
    checked = _schema(DEFAULT_SCHEMA if schema is None else schema)
    defaults = {
        key: value
        for key, (variable, value) in _DEFAULTS.items()
        if key not in params and variable not in os.environ
    }
    target = make_conninfo(rest, **defaults)
    if keyword_form:
        display = make_conninfo("", **{k: v for k, v in params.items() if k not in _SECRET_KEYS})
    parsed = StoreURL("postgresql", target, checked, display, secrets)
    # A secret libpq found where our split did not (it should not happen) is still hidden.
    return StoreURL("postgresql", target, checked, parsed.redact(display), secrets)


_COMMON_LIBPQ: Final = (
    "host",
    "port",
    "dbname",
    "user",
    "sslmode",
    "sslrootcert",
    "connect_timeout",
    "application_name",
    "target_session_attrs",
    "options",
)
"""The libpq parameters an unknown parameter's message names, of the fifty or so libpq
knows (some of which have "secret" in their names: a reader would look for a leak)."""


def _libpq_keywords(psycopg: Any) -> list[str]:
    """The connection parameters this libpq knows (its ``PQconndefaults``)."""
    return [option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()]


def _unknown_to_libpq(psycopg: Any, uri: str) -> str | None:
    """The first parameter of a URI's query that libpq does not know, if any: the name
    only (percent-decoded), which libpq's own message would show with the string."""
    from urllib.parse import unquote  # noqa: PLC0415  (SQLite's start skips it)

    known = set(_libpq_keywords(psycopg))
    start = uri.index("//") + 2
    query = uri[_userinfo_end(uri, start) or start :].partition("?")[2]  # not a password's "?"
    for part in query.split("&") if query else ():
        key = unquote(part.partition("=")[0])
        if key and key not in known:
            return key
    return None


def _split_uri(url: str) -> tuple[str, str | None, tuple[str, ...], str]:
    """A URI without our ``schema`` parameter, that parameter, the raw secrets, and the
    URI for display (without them).

    The parts are found as libpq finds them: user info runs to the first ``@``
    met before any ``/``, and the query starts at the first ``?`` after it.
    The text is otherwise left exactly as given.
    """
    from urllib.parse import unquote  # noqa: PLC0415  (SQLite's start skips it)

    start = url.index("//") + 2
    at = _userinfo_end(url, start)
    userinfo = url[start : at - 1] if at is not None else ""
    host_from = start if at is None else at
    base, mark, query = url[host_from:].partition("?")
    if "@" in base:
        raise LockUsageError(
            "the PostgreSQL URL has an '@' libpq would read as part of the host or database "
            "(not shown: it may be in a password): percent-encode '@' as %40 and '/' as %2F "
            "in the user name and password"
        )
    user, colon, password = userinfo.partition(":")
    secrets = [password] if colon else []
    kept: list[str] = []
    shown: list[str] = []
    schemas: list[str] = []
    for part in query.split("&") if mark else ():
        key, _, value = part.partition("=")
        if unquote(key) == "schema":
            schemas.append(unquote(value))
            continue
        kept.append(part)
        if unquote(key) in _SECRET_KEYS:
            secrets.append(value)
        else:
            shown.append(part)
    if len(schemas) > 1:
        raise LockUsageError("the PostgreSQL URL gives schema= more than once")
    scheme = url[:start]
    rest = scheme + url[start:host_from] + base + ("?" + "&".join(kept) if kept else "")
    kept_shown = [*shown, f"schema={schemas[0]}"] if schemas else shown
    display = (
        scheme
        + (f"{user}@" if user else "")
        + base
        + ("?" + "&".join(kept_shown) if kept_shown else "")
    )
    return rest, schemas[0] if schemas else None, tuple(secrets), display


def _userinfo_end(url: str, start: int) -> int | None:
    """Just past the ``@`` ending the user info, if libpq would find one (before any ``/``)."""
    for i in range(start, len(url)):
        if url[i] == "@":
            return i + 1
        if url[i] == "/":
            return None
    return None


def _schema(schema: str) -> str:
    if not _SCHEMA_NAME.fullmatch(schema):
        raise LockUsageError(
            f"schema {schema[:60]!r} is not a plain identifier: use 1 to 52 lower-case letters, "
            "digits and underscores, starting with a letter or underscore"
        )
    if schema in _KEYWORDS or schema.startswith("pg_"):
        raise LockUsageError(
            f"schema {schema!r} cannot be used: PostgreSQL reserves it "
            f"({'the pg_ prefix' if schema.startswith('pg_') else 'a keyword'}); choose another"
        )
    return schema
