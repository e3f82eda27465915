"""Store URLs: parsed and checked before anything touches a database.

Accepted forms::

    /path/to/locks.db  ./locks.db          a plain path: a SQLite file
    sqlite:///relative/path.db             sqlite:////absolute/path.db
    postgresql://user@host:port/db?schema=NAME
    host=... dbname=... (libpq's keyword/value form; the default schema)
    etcd://host:port[,host:port...][/prefix]
    mysql://user[:password]@host[:port]/db    (also mariadb://)

A SQLite path is made absolute here, and shown so, so that every message
names the file actually used whatever the working directory.

PostgreSQL connection strings go to libpq exactly as given, less our own
``schema`` parameter: psycopg's `conninfo_to_dict` (libpq's own parser) reads
them, so whatever psql accepts works, and what the string leaves out comes
from the ``PG*`` environment and ``~/.pgpass`` as libpq decides
(``postgresql:///db?host=/var/run/postgresql`` is a local socket).

Secrets are found by the same parser: the password (and ``sslpassword``)
libpq read, in the form it appears in the string and percent-decoded, is
what `StoreURL.redact` removes from any text shown — the driver's messages
included. libpq's own parse errors quote the string, so they are never shown;
a URL libpq would split somewhere unexpected (an unencoded ``/`` or ``@`` in
a password makes it read part of the password as host or port) is refused
before any connection is tried.
"""

from __future__ import annotations

import os
import re
from typing import Any, Final, NamedTuple

from lockwarden.errors import LockUsageError, StoreError
from lockwarden.store.bounds import CALL_TIMEOUT
from lockwarden.store.validate import shown

DEFAULT_SCHEMA = "lockwarden"

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

# An etcd key prefix: every key of the store starts with "<prefix>/".
_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_ENDPOINT = re.compile(r"(?P<host>[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")

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

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_KEYWORD_FORM = re.compile(r"\s*[A-Za-z_]+\s*=")

_EXAMPLES = (
    "a file path, sqlite:////abs/path.db, postgresql://user@host:5432/db, "
    "etcd://host:2379,host2:2379/prefix or mysql://user@host:3306/db"
)


class StoreURL(NamedTuple):
    """Where a store lives, split into what each backend needs."""

    backend: str
    """"sqlite", "postgresql", "etcd" or "mysql"."""
    target: str
    """The absolute SQLite file path, the libpq connection string (without ``schema``),
    the etcd endpoints ("host:port,host:port"), or the MySQL URL (read by `mysql_options`)."""
    schema: str
    """The PostgreSQL schema holding the store's tables, or the etcd key prefix
    ("" on SQLite)."""
    display: str
    """The URL for messages: everything but the password."""
    secrets: tuple[str, ...] = ()
    """Every form in which a secret of the string may appear (longest first)."""
    call_timeout: float = CALL_TIMEOUT
    """Seconds one call to the database may take, retries included (`bounds`): set by
    ``connect(call_timeout=...)``."""

    def __repr__(self) -> str:
        # Never the target nor the secrets: a libpq string may hold a password.
        return (
            f"StoreURL(backend={self.backend!r}, schema={self.schema!r}, display={self.display!r})"
        )

    def redact(self, text: str) -> str:
        """``text`` with every form of the string's secrets replaced by ``***``."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


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
            return _postgres(url, keyword_form=True)
        return _sqlite_file(url, url)
    name = scheme.group(1).lower()
    if name in ("postgresql", "postgres") and url[scheme.end() :].startswith("//"):
        return _postgres(url, keyword_form=False)
    if name == "sqlite" and url[scheme.end() :].startswith("//"):
        return _sqlite(url[scheme.end() + 2 :])
    if name in ("mysql", "mariadb") and url[scheme.end() :].startswith("//"):
        return _mysql(url)
    if name == "etcd" and url[scheme.end() :].startswith("//"):
        return _etcd(url[scheme.end() + 2 :])
    if name in ("postgresql", "postgres", "sqlite", "etcd", "mysql", "mariadb"):
        raise LockUsageError(f"write {name}:// (two slashes, then the host, or none): {_EXAMPLES}")
    # Only the scheme is quoted: the rest may hold a password we cannot find.
    raise LockUsageError(
        f"unsupported store URL scheme {scheme.group(1)!r}: use {_EXAMPLES} "
        "(a file whose name has a colon: write ./NAME)"
    )


def _sqlite(rest: str) -> StoreURL:
    """``sqlite://`` + rest: an empty host, then the path (relative after one slash)."""
    host, slash, path = rest.partition("/")
    if host:  # never quoted: a PostgreSQL URL given the wrong scheme carries a password there
        raise LockUsageError(
            "a SQLite URL names a host; SQLite files are local: write "
            "sqlite:///relative/path.db, sqlite:////absolute/path.db or just the path"
        )
    if "?" in path or "#" in path:  # names only: a value may be a password
        raise LockUsageError(
            f"a SQLite URL takes no parameters{_named(path)}; a file whose name has '?' or "
            "'#': give the path alone"
        )
    if not slash:
        path = ""
    return _sqlite_file(path, f"sqlite:///{path}")


def _sqlite_file(path: str, given: str) -> StoreURL:
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


def _etcd(rest: str) -> StoreURL:
    """``etcd://`` + rest: endpoints, then an optional key prefix."""
    netloc, _, prefix = rest.partition("/")
    if "@" in netloc or "?" in rest or "#" in rest:  # not quoted: it may hold a password
        named = "" if "@" in netloc else _named(rest)  # a "?" may be a password's
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


def _mysql(url: str) -> StoreURL:
    """``mysql://user[:password]@host[:port]/db?option=...`` (also ``mariadb://``).

    The database holds the store's tables, as a schema does on PostgreSQL.
    """
    mysql_options(url)  # every check happens here, before any connection
    return StoreURL("mysql", url, "", _redact(url))


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
    shown = _redact(url)
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


def _postgres(url: str, *, keyword_form: bool) -> StoreURL:
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


def _named(rest: str) -> str:
    """ ": 'a', 'b' are unknown": the names of the parameters after the first ``?`` of
    ``rest``, never their values (one may be a password), for a refusal."""
    from urllib.parse import parse_qsl  # noqa: PLC0415  (SQLite's start skips it)

    query = rest.partition("?")[2].partition("#")[0]
    names = list(dict.fromkeys(key for key, _ in parse_qsl(query, keep_blank_values=True)))
    if not names:
        return ""
    return f": {', '.join(map(repr, names))} {'is' if len(names) == 1 else 'are'} unknown"


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


def _secret(key: str) -> bool:
    """A parameter never shown: password, and libpq's sslpassword (or any misspelling)."""
    return "password" in key.lower()


def _redact(url: str) -> str:
    """The URL without its password (in the user part or as a parameter) and without a
    fragment (which the store ignores, and which may hold anything); as given otherwise."""
    from urllib.parse import parse_qsl, quote, urlencode, urlsplit  # noqa: PLC0415  (as above)

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
