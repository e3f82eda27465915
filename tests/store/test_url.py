"""Store URLs: the forms libpq and psql accept, plain paths, and clear refusals.

Secrets: a password with a reserved character, written raw or encoded, never
appears in an error, in ``str``/``repr`` of the store, or in the CLI's line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import lockwarden
from chaos.etcd_cluster import free_ports
from lockwarden import LockUsageError, StoreError
from lockwarden.store.backends.mysql.url import mysql_options
from lockwarden.store.backends.postgresql import connections as pgconn
from lockwarden.store.backends.postgresql.url import _KEYWORDS
from lockwarden.store.bounds import CALL_TIMEOUT
from lockwarden.store.opening import parse_url
from tests.conftest import PG, pg_admin

LOCKWARDEN = Path(sys.executable).with_name("lockwarden")


def test_a_plain_path_is_a_sqlite_file_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for given in ("locks.db", "./locks.db", "sqlite:///locks.db", str(tmp_path / "locks.db")):
        parsed = parse_url(given)
        assert (parsed.backend, parsed.target) == ("sqlite", str(tmp_path / "locks.db"))
        assert parsed.display == f"sqlite:///{tmp_path / 'locks.db'}"
    with lockwarden.connect("locks.db") as store, store.session("app") as s, s.lock("x"):
        assert store.url == f"sqlite:///{tmp_path / 'locks.db'}"
    assert parse_url("sqlite:////abs/path.db").target == "/abs/path.db"


@pytest.mark.parametrize(
    ("url", "params", "schema"),
    [
        ("postgresql://user@host:5433/db", {"user": "user", "host": "host", "port": "5433"}, None),
        ("postgres://u@h/db?schema=lw_x&sslmode=disable", {"sslmode": "disable"}, "lw_x"),
        ("postgresql://u@h/db?connect_timeout=3", {"connect_timeout": "3"}, None),
        ("postgresql:///test?host=127.0.0.1&user=postgres", {"host": "127.0.0.1"}, None),
        ("postgresql:///test?host=/var/run/postgresql", {"host": "/var/run/postgresql"}, None),
        ("postgresql://%2Fvar%2Frun%2Fpostgresql/test", {"host": "/var/run/postgresql"}, None),
        ("host=h dbname=d application_name=me", {"host": "h", "application_name": "me"}, None),
    ],
)
def test_postgres_strings_reach_libpq_as_written(
    url: str, params: dict[str, str], schema: str | None
) -> None:
    parsed = parse_url(url)
    found = conninfo_to_dict(parsed.target)
    assert params.items() <= found.items()
    assert "schema" not in found
    assert found["connect_timeout"] == params.get("connect_timeout", "10")
    assert parsed.schema == (schema or "lockwarden")


@pytest.mark.parametrize(
    ("url", "target", "prefix"),
    [
        ("etcd://127.0.0.1:2379", "127.0.0.1:2379", "lockwarden"),
        ("etcd://a:1,b.example:2379/ops-1.x", "a:1,b.example:2379", "ops-1.x"),
    ],
)
def test_etcd_urls(url: str, target: str, prefix: str) -> None:
    parsed = parse_url(url)
    assert (parsed.backend, parsed.target, parsed.schema) == ("etcd", target, prefix)


def test_libpq_environment_wins_over_our_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "3")
    monkeypatch.setenv("PGAPPNAME", "mine")
    found = conninfo_to_dict(parse_url("postgresql://h/db").target)
    assert "connect_timeout" not in found and "application_name" not in found


@pytest.mark.parametrize(
    "template",
    [
        "postgresql:///{db}?host=127.0.0.1&user=postgres&schema={schema}",  # psql's own form
        "postgresql:///{db}?host=/var/run/postgresql&schema={schema}",  # the Unix socket
        "postgresql:///{db}?schema={schema}",  # everything else from PG* variables
    ],
)
def test_forms_libpq_accepts_open_a_store(
    template: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dbname = conninfo_to_dict(PG)["dbname"]
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGUSER", "postgres")
    monkeypatch.setenv("PGAPPNAME", "from-env")
    with lockwarden.connect(template.format(db=dbname, schema=pg_schema)) as store:
        with store.session("app") as s, s.lock("x") as held:
            assert held.token > 0
        [row] = store._backend.query("SELECT current_setting('application_name') AS a")
        assert row["a"] == "from-env"


def test_mysql_urls_become_driver_options() -> None:
    url = (
        "mariadb://lw%40ops:p%2Fw@db.example:3307/locks"
        "?unix_socket=/run/mysqld/mysqld.sock&ssl=true&ssl_ca=/ca.pem&connect_timeout=3"
    )
    parsed = parse_url(url)
    assert parsed.backend == "mysql"
    assert "p%2Fw" not in parsed.display
    assert parsed.display.endswith(
        "@db.example:3307/locks?unix_socket=%2Frun%2Fmysqld%2Fmysqld.sock"
        "&ssl=true&ssl_ca=%2Fca.pem&connect_timeout=3"
    )
    assert mysql_options(parsed.target) == {
        "user": "lw@ops",
        "password": "p/w",
        "host": "db.example",
        "port": 3307,
        "database": "locks",
        "connect_timeout": 3,
        "unix_socket": "/run/mysqld/mysqld.sock",
        "ssl": True,
        "ssl_ca": "/ca.pem",
    }


def test_a_space_in_a_parameter_reaches_libpq_as_a_space(pg_url: str) -> None:
    url = pg_url + "&options=-c%20lock_timeout%3D4321"
    with lockwarden.connect(url) as store:
        assert store._backend.query("SELECT current_setting('lock_timeout') AS t") == [
            {"t": "4321ms"}
        ]


def test_reserved_keywords_are_the_servers() -> None:
    with pg_admin() as conn:
        words = {
            r[0] for r in conn.execute("SELECT word FROM pg_get_keywords() WHERE catcode <> 'U'")
        }
    assert words == _KEYWORDS


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "non-empty string"),
        (None, "non-empty string"),
        ("mongodb://h/db", "unsupported store URL scheme"),
        ("mongodb:db", "unsupported store URL scheme"),
        ("://u:secret@h/db", "no scheme"),  # found by the fuzz: it was a file name, shown
        ("sqlite:x.db", "two slashes"),
        ("mysql://h/db", "names no user"),
        ("mysql://u@h", "must name one database"),
        ("mysql://u@h/a/b", "must name one database"),
        ("mysql://u:secret@[::1/db", "malformed host"),
        ("mysql://u@h:99999/db", "bad port"),
        ("mysql://u@h/db?sslmode=require", "unknown parameter 'sslmode'"),
        ("mysql://u@h/db?connect_timeout=soon", "positive whole number"),
        ("mysql://u@h/db?ssl=maybe", "true or false"),
        ("mariadb://u@h/db?charset=latin1", "must be utf8mb4"),
        ("sqlite://host/x.db", "names a host"),
        ("sqlite:///", "names no file"),
        ("sqlite:///dir/", "names no file"),
        ("sqlite:///:memory:", "in-memory"),
        ("sqlite:///x.db?mode=ro", "takes no parameters"),
        ("postgresql://h/db?schema=Bad-Name", "not a plain identifier"),
        ("postgresql://h/db?schema=a;drop", "not a plain identifier"),
        ("postgresql://h/db?schema=" + "x" * 53, "not a plain identifier"),
        ("postgresql://h/db?schema=a&schema=b", "more than once"),
        ("postgresql://h/db?schema=user", "PostgreSQL reserves it"),
        ("postgresql://h/db?schema=pg_locks", "PostgreSQL reserves it"),
        ("host=h schema=s", "URL form"),
        ("host=h dbname", "cannot parse"),
        ("postgresql://u:secret@[::1/db", "cannot parse"),
        ("sqlite:///locks\x00.db", "NUL"),
        ("etcd://h/ops", "not host:port"),
        ("etcd://h:0", "not host:port"),
        ("etcd://h:2379,/ops", "not host:port"),
        ("etcd://h:2379/a/b", "not plain"),
        ("etcd://h:2379/.x", "not plain"),
        ("etcd://u:secret@h:2379", "takes no user"),
        ("etcd://h:2379?timeout=1", "takes no user, password or parameters: 'timeout' is unknown"),
        ("sqlite:///x.db?mode=ro&cache", "'mode', 'cache' are unknown"),
        ("mongodb://h/db", "postgresql://user@host:5432/db, etcd://host"),  # one comma each
        ("locks\udc80.db", "not valid Unicode"),
    ],
)
def test_refused(url: object, message: str) -> None:
    with pytest.raises(LockUsageError, match=message):
        parse_url(url)


@pytest.mark.parametrize(
    ("url", "known"),
    [
        ("mysql://u@h/db?foo=s3cr3t", "unix_socket, charset, connect_timeout, ssl, ssl_ca"),
        ("mariadb://u:pw@h/db?ssl=1&foo=s3cr3t", "ssl_cert, ssl_key"),
        ("postgresql://u@h/db?foo=s3cr3t", "schema (lockwarden's) and libpq's connection"),
        ("postgres://u@h/db?schema=x&sslmode=require&f%6Fo=s3cr3t", "sslmode, "),
        ("postgresql://u:pa%3Fhidden@h/db?foo=s3cr3t", "host, "),
        ("postgresql://u:pa?hidden@h/db?foo=s3cr3t", "port, "),  # a raw "?" in the password
    ],
)
def test_an_unknown_parameter_is_named_with_the_known_ones_and_never_its_value(
    url: str, known: str
) -> None:
    """A PostgreSQL one got advice on percent-encoding passwords; a MySQL one showed the
    URL with the parameter's value, which may be a secret."""
    with pytest.raises(LockUsageError) as caught:
        parse_url(url)
    message = str(caught.value)
    assert "unknown parameter 'foo' (its value not shown): the known ones are" in message
    assert known in message
    assert "s3cr3t" not in message and "hidden" not in message
    assert "percent-encode" not in message


def test_a_schema_that_is_a_keyword_was_a_syntax_error() -> None:
    """Why the keywords are refused: unquoted, the DDL does not parse."""
    with pg_admin() as conn, pytest.raises(psycopg.errors.SyntaxError):
        conn.execute("CREATE SCHEMA IF NOT EXISTS user")


RESERVED = ["%", "/", "#", "?", "@", " "]


def _password(char: str) -> str:
    return f"Pa{char}ss{char}w0rd"


def _urls(char: str, host: str = "127.0.0.1:1") -> list[str]:
    password = _password(char)
    name, port = host.split(":")
    return [
        f"postgresql://postgres:{password}@{host}/test",  # raw, as a user might paste it
        f"postgresql://postgres:{quote(password, safe='')}@{host}/test",  # encoded
        f"postgresql://postgres@{host}/test?password={quote(password, safe='')}",
        f"host={name} port={port} dbname=test password='{password}'",
    ]


def _assert_hidden(char: str, text: str) -> None:
    password = _password(char)
    for form in {password, quote(password, safe=""), quote(password)}:
        assert form not in text, f"{form!r} in {text!r}"
    assert f"ss{char}w0" not in text and "Pa" + char not in text, text


@pytest.mark.parametrize("char", RESERVED)
def test_no_message_shows_a_password(char: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgconn, "RETRY_DELAYS", ())
    for url in _urls(char):
        with pytest.raises((LockUsageError, StoreError)) as caught:
            lockwarden.connect(url)
        _assert_hidden(char, str(caught.value))
        _assert_hidden(char, repr(caught.value))
        try:
            shown = parse_url(url)
        except LockUsageError:
            continue
        _assert_hidden(char, shown.display)
        _assert_hidden(char, repr(shown))


@pytest.mark.parametrize("char", RESERVED)
def test_a_store_never_shows_its_password(char: str, pg_schema: str) -> None:
    """The shared server trusts 127.0.0.1, so any password connects."""
    for given in _urls(char, host="127.0.0.1:5432"):
        if not given.startswith("postgresql"):
            _assert_hidden(char, repr(parse_url(given)))  # no schema: not opened
            continue
        url = given + ("&" if "?password" in given else "?") + f"schema={pg_schema}"
        try:
            store = lockwarden.connect(url)
        except LockUsageError as refused:  # an unencoded '/', '@' or '%' or space
            _assert_hidden(char, str(refused))
            continue
        with store:
            for text in (str(store), repr(store), store.url):
                _assert_hidden(char, text)
            with pytest.raises(StoreError) as caught:  # a driver error quoting the password
                store._backend.query(f'SELECT 1 FROM "{_password(char)}"')
            _assert_hidden(char, str(caught.value))


@pytest.mark.slow
@pytest.mark.parametrize("char", RESERVED)
def test_the_cli_line_never_shows_a_password(char: str, tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path)}
    raw, _, _, keywords = _urls(char)
    for url in (raw, keywords):
        done = subprocess.run(
            [str(LOCKWARDEN), "status", "--db", url],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert done.returncode in (64, 69), done
        _assert_hidden(char, done.stderr + done.stdout)
        assert len(done.stderr.splitlines()) == 1, done.stderr


def test_redact_removes_every_form() -> None:
    parsed = parse_url("postgresql://me:p%40ss%2Fw@h/db?sslpassword=k3y")
    assert parsed.display == "postgresql://me@h/db"
    assert parsed.redact("p@ss/w, p%40ss%2Fw and k3y") == "***, *** and ***"


def test_connect_refuses_bad_options_before_connecting() -> None:
    with pytest.raises(LockUsageError, match="PostgreSQL and SQLite only"):
        lockwarden.connect("mysql://nobody@127.0.0.1:1/never", durability="relaxed")
    with pytest.raises(LockUsageError, match="durability"):
        lockwarden.connect("sqlite:///never.db", durability="fast")
    with pytest.raises(LockUsageError, match="max_hold"):
        lockwarden.connect("sqlite:///never.db", max_hold=0)
    with pytest.raises(LockUsageError, match="on_stale"):
        lockwarden.connect("sqlite:///never.db", on_stale="steal")
    with pytest.raises(LockUsageError, match="lock_delay"):
        lockwarden.connect("sqlite:///never.db", lock_delay=float("nan"))


def test_an_unreachable_etcd_cluster_is_a_store_error_in_bounded_time() -> None:
    [port] = free_ports(1)  # nothing listens there
    started = time.monotonic()
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}.*majority"):
        lockwarden.connect(f"etcd://127.0.0.1:{port}/x")
    assert time.monotonic() - started < CALL_TIMEOUT + 2


def test_a_sqlite_file_in_a_missing_directory_is_a_store_error() -> None:
    with pytest.raises(StoreError, match=r"sqlite:////no/such/dir/locks\.db"):
        lockwarden.connect("sqlite:////no/such/dir/locks.db")


def test_the_cli_takes_a_plain_path_and_shows_it_absolute(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path)}
    done = subprocess.run(
        [str(LOCKWARDEN), "init", "--db", "./here.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (
        0,
        f"lock store ready: sqlite:///{tmp_path}/here.db\n",
    )


@pytest.mark.parametrize("char", ["?", "#", "/"])
def test_a_mysql_password_with_an_unencoded_delimiter_is_refused_unshown(char: str) -> None:
    """Where such a password ends is unclear: a message quoting the URL showed part of it."""
    with pytest.raises(LockUsageError, match="percent-encode") as err:
        lockwarden.connect(f"mysql://user:se{char}cret@db.internal/locks")
    assert "cret" not in str(err.value) and "db.internal" not in str(err.value)
