"""Where a store lives (`StoreURL`), and what the backends' URL parsers share.

Each backend parses its own URLs (``backends/<name>/url.py``); `opening.parse_url`
picks the parser by the scheme, so a program on the default SQLite store loads
none of the others. Accepted forms::

    /path/to/locks.db  ./locks.db          a plain path: a SQLite file
    sqlite:///relative/path.db             sqlite:////absolute/path.db
    postgresql://user@host:port/db?schema=NAME
    host=... dbname=... (libpq's keyword/value form; the default schema)
    etcd://host:port[,host:port...][/prefix]
    mysql://user[:password]@host[:port]/db    (also mariadb://)

A URL is parsed and checked before anything touches a database; what may be a
secret is never shown (`StoreURL.redact`, `redact_url`).
"""

from __future__ import annotations

from typing import NamedTuple

from lockwarden.store.bounds import CALL_TIMEOUT

DEFAULT_SCHEMA = "lockwarden"


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


def named_parameters(rest: str) -> str:
    """ ": 'a', 'b' are unknown": the names of the parameters after the first ``?`` of
    ``rest``, never their values (one may be a password), for a refusal."""
    from urllib.parse import parse_qsl  # noqa: PLC0415  (SQLite's start skips it)

    query = rest.partition("?")[2].partition("#")[0]
    names = list(dict.fromkeys(key for key, _ in parse_qsl(query, keep_blank_values=True)))
    if not names:
        return ""
    return f": {', '.join(map(repr, names))} {'is' if len(names) == 1 else 'are'} unknown"


def _secret(key: str) -> bool:
    """A parameter never shown: password, and libpq's sslpassword (or any misspelling)."""
    return "password" in key.lower()


def redact_url(url: str) -> str:
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
