"""Store URLs: accepted forms, and clear refusals before any connection."""

from __future__ import annotations

import pytest

import lockwarden
from lockwarden import LockUsageError, StoreError
from lockwarden.store.url import parse_url


@pytest.mark.parametrize(
    ("url", "backend", "target", "schema"),
    [
        ("sqlite:///relative/path.db", "sqlite", "relative/path.db", ""),
        ("sqlite:////abs/path.db", "sqlite", "/abs/path.db", ""),
        (
            "postgresql://user@host:5433/db",
            "postgresql",
            "postgresql://user@host:5433/db?connect_timeout=10",
            "lockwarden",
        ),
        (
            "postgres://u@h/db?schema=lw_x&sslmode=disable",
            "postgresql",
            "postgres://u@h/db?sslmode=disable&connect_timeout=10",
            "lw_x",
        ),
        (
            "postgresql://u@h/db?connect_timeout=3",
            "postgresql",
            "postgresql://u@h/db?connect_timeout=3",
            "lockwarden",
        ),
    ],
)
def test_accepted(url: str, backend: str, target: str, schema: str) -> None:
    parsed = parse_url(url)
    assert (parsed.backend, parsed.target, parsed.schema) == (backend, target, schema)


def test_a_space_in_a_parameter_reaches_libpq_as_a_space(pg_url: str) -> None:
    """Re-encoded with %20, not "+", which libpq would pass on as a plus sign."""
    url = pg_url + "&options=-c%20lock_timeout%3D4321"
    assert "options=-c%20lock_timeout%3D4321" in parse_url(url).target
    store = lockwarden.connect(url)
    try:
        assert store._backend.query("SELECT current_setting('lock_timeout') AS t") == [
            {"t": "4321ms"}
        ]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "non-empty string"),
        (None, "non-empty string"),
        ("mysql://h/db", "unsupported store URL scheme"),
        ("locks.db", "unsupported store URL scheme"),
        ("sqlite://host/x.db", "names a host"),
        ("sqlite:///", "names no file"),
        ("sqlite:///dir/", "names no file"),
        ("sqlite:///:memory:", "in-memory"),
        ("sqlite:///x.db?mode=ro", "takes no parameters"),
        ("postgresql://h/db?schema=Bad-Name", "not a plain identifier"),
        ("postgresql://h/db?schema=a;drop", "not a plain identifier"),
        ("postgresql://h/db?schema=" + "x" * 53, "not a plain identifier"),
        ("postgresql://h/db?schema=a&schema=b", "more than once"),
        # Found by the fuzz: these were plain ValueErrors from urlsplit and sqlite3.
        ("postgresql://u:secret@[::1/db", "malformed"),
        ("sqlite:///locks\x00.db", "NUL"),
    ],
)
def test_refused(url: object, message: str) -> None:
    with pytest.raises(LockUsageError, match=message):
        parse_url(url)


def test_messages_never_show_the_password() -> None:
    parsed = parse_url("postgresql://me:hunter2@db.example:5432/locks?password=x2&schema=s")
    assert parsed.display == "postgresql://me@db.example:5432/locks?schema=s"
    with pytest.raises(LockUsageError) as caught:
        parse_url("postgresql://me:hunter2@db.example/locks?schema=NO")
    assert "hunter2" not in str(caught.value)
    parsed = parse_url("postgresql://db.example/locks?sslpassword=hunter2&sslmode=require")
    assert parsed.display == "postgresql://db.example/locks?sslmode=require"
    parsed = parse_url("postgresql://db.example/locks#?password=hunter2")  # ignored, not shown
    assert parsed.display == "postgresql://db.example/locks"


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://me:hunter2@db.example/locks.db",  # a PostgreSQL URL with the wrong scheme
        "sqlite:///locks.db?password=hunter2",
        "sqlite://me:hunter2@db.example/",
        "sqlite:///locks.db?sslpassword=hunter2",
        "sqlite:///locks.db??password=hunter2",
    ],
)
def test_sqlite_url_messages_never_show_the_password(url: str) -> None:
    """Found by the fuzz: the SQLite refusals quoted the URL (or its query) as given."""
    with pytest.raises(LockUsageError) as caught:
        parse_url(url)
    assert "hunter2" not in str(caught.value)


def test_connect_refuses_bad_options_before_connecting(tmp_path: object) -> None:
    with pytest.raises(LockUsageError, match="PostgreSQL only"):
        lockwarden.connect("sqlite:///never.db", durability="relaxed")
    with pytest.raises(LockUsageError, match="durability"):
        lockwarden.connect("sqlite:///never.db", durability="fast")
    with pytest.raises(LockUsageError, match="max_hold"):
        lockwarden.connect("sqlite:///never.db", max_hold=0)
    with pytest.raises(LockUsageError, match="on_stale"):
        lockwarden.connect("sqlite:///never.db", on_stale="steal")
    with pytest.raises(LockUsageError, match="lock_delay"):
        lockwarden.connect("sqlite:///never.db", lock_delay=float("nan"))


def test_a_sqlite_file_in_a_missing_directory_is_a_store_error() -> None:
    with pytest.raises(StoreError, match=r"sqlite:////no/such/dir/locks\.db"):
        lockwarden.connect("sqlite:////no/such/dir/locks.db")
