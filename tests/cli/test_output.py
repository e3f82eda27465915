"""What lockwarden shows: JSON from every command, escaped text, completion and the man page."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

import lockwarden
import lockwarden.store
from lockwarden.cli import main
from lockwarden.cli.terminal import printable
from lockwarden.store import Store
from tests.cli.conftest import Cli, on_terminal


@pytest.fixture
def url(sql_url: str) -> str:
    """Output is the CLI's, the same on every backend: run on the SQL ones, where a test can
    also write a holder's host by hand."""
    return sql_url


@pytest.fixture
def offline(tmp_path: Path) -> Cli:
    """For what never reaches a database (once, not per backend)."""
    return Cli("nosuch://", tmp_path)


def test_every_command_speaks_json(cli: Cli, store: Store) -> None:
    def shape(*args: str) -> dict[str, object]:
        result = cli(*args, "--json")
        assert (result.status, result.err) == (0, ""), result
        found: dict[str, object] = json.loads(result.out)
        assert found["format"] == 1
        return found

    assert shape("init")["database"] == store.url
    assert shape("init", "--check")["steps"] == []
    assert shape("permits", "job") == {"format": 1, "name": "job", "read": None, "write": 1}
    assert shape("permits", "job", "--write", "2")["write"] == 2
    assert shape("clean") == {"format": 1, "sessions": 0, "locks": 0, "waiters": 0}
    with store.session(app_id="a") as s:
        s.lock("job")
        assert shape("status")["locks"]
        assert shape("break", "--yes", "job") == {"format": 1, "name": "job", "removed": 1}


def test_a_failure_under_json_is_one_json_object_on_stderr(cli: Cli, store: Store) -> None:
    with store.session(app_id="holder") as s:
        s.lock("job")
        busy = cli("run", "--json", "job", "--", "true")
        assert busy.status == 75 and busy.out == ""
        assert "'job' is busy: held by app 'holder'" in busy.error_line()  # parses the JSON
    bad = cli("permits", "job", "--write", "0", "--json")
    assert bad.status == 64
    assert json.loads(bad.err)["prog"] == "lockwarden permits"


@pytest.mark.parametrize("command", ["status", "permits job", "clean", "break job", "init"])
def test_an_unknown_option_points_at_the_commands_own_help(offline: Cli, command: str) -> None:
    name = command.split(maxsplit=1)[0]
    result = offline(*command.split(), "--frobnicate")
    assert result.status == 64
    assert f"(see 'lockwarden {name} --help')" in result.error_line()


EVIL = "job\x1b[2J\x1b]0;owned\x07\rfake\u202erow"
"""A lock name that would clear the screen, retitle the window, ring, rewrite the line."""
RAW = ("\x1b[2J", "\x1b]0;", "\x07", "\r", "\u202e")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name/with:punct", "plain name/with:punct"),
        ("a\x1bb", "a\\x1bb"),
        ("cr\rbell\a", "cr\\rbell\\x07"),
        ("del\x7fc1\x9b", "del\\x7fc1\\x9b"),
        ("bidi\u202eoverride\u200b", "bidi\\u202eoverride\\u200b"),
        ("tab\tnl\n", "tab\\tnl\\n"),
        ("ünïcode 名前", "ünïcode 名前"),
    ],
)
def test_printable_escapes_what_a_terminal_would_act_on(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_status_shows_names_and_app_ids_escaped(cli: Cli, store: Store) -> None:
    with store.session(app_id="app\x1b[31mred") as s:
        s.lock(EVIL)
        piped = cli("status").out
        seen, status = on_terminal(cli, "status", until=b"")
    assert status == 0
    assert not any(raw in piped for raw in RAW)
    assert "job\\x1b[2J\\x1b]0;owned\\x07\\rfake\\u202erow" in piped.replace("\n", "")
    assert "app\\x1b[31mred" in piped
    shown = seen.decode()
    assert not any(raw in shown for raw in ("\x1b[2J", "\x1b]0;", "\x07", "\u202e"))
    assert "\\x1b[2J" in shown


def test_error_lines_and_the_break_confirmation_are_escaped(cli: Cli, store: Store) -> None:
    with store.session(app_id="app\x1b[2Jx") as s:
        s.lock(EVIL)
        # A host name is whatever the holder's machine says it is.
        store._backend.query(
            "UPDATE {p}lw_sessions SET host = :host WHERE id = :id",
            {"host": "db\x1b[2J\r1", "id": s.id},
            write=True,
        )
        busy = cli("run", EVIL, "--", "true")
        assert busy.status == 75
        line = busy.error_line()
        assert not any(raw in line for raw in RAW)
        assert "app\\x1b[2Jx" in line and "on db\\x1b[2J\\r1 pid" in line
        seen, status = on_terminal(cli, "break", EVIL, until=b"[y/N]", answer="n\n")
    assert status == 1
    assert b"\x1b[2J" not in seen and b"\x07" not in seen
    assert b"app\\x1b[2Jx" in seen and b"on db\\x1b[2J\\r1 pid" in seen


def test_every_command_is_declared_and_parsed_alone() -> None:
    """`main.parser(only=...)` declares one command; COMMANDS must name them all."""
    from lockwarden.cli.generate import _commands  # noqa: PLC0415

    assert [c.name for c in _commands(main.parser())] == list(main.COMMANDS)
    for name in main.COMMANDS:
        assert [c.name for c in _commands(main.parser(name))] == [name]


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers for the last of ``words``, with the generated completion loaded."""
    call = (
        f"{script}\nCOMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); "
        f'COMP_CWORD={len(words) - 1}; _lockwarden; printf "%s\\n" "${{COMPREPLY[@]}}"'
    )
    done = subprocess.run(["bash", "-c", call], capture_output=True, text=True, check=True)
    return done.stdout.split()


@pytest.mark.skipif(not shutil.which("bash"), reason="bash is not installed")
def test_bash_completion_follows_the_parser(offline: Cli) -> None:
    script = offline("completion", "bash").out
    assert {"run", "hold", "status", "break", "permits", "--db"} <= set(
        _complete(script, "lockwarden", "")
    )
    assert _complete(script, "lockwarden", "per") == ["permits"]
    assert _complete(script, "lockwarden", "--db", "x.db", "cl") == ["clean"]
    assert _complete(script, "lockwarden", "run", "--co") == ["--conflict-exit-code"]
    assert set(_complete(script, "lockwarden", "completion", "")) >= {"bash", "zsh"}
    assert "true" in _complete(script, "lockwarden", "run", "job", "--", "tru")


@pytest.mark.skipif(not shutil.which("zsh"), reason="zsh is not installed")
def test_zsh_loads_its_completion(offline: Cli) -> None:
    script = offline("completion", "zsh").out
    done = subprocess.run(
        ["zsh", "-f", "-c", f"autoload -U compinit && compinit -u\n{script}\nprint loaded"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "loaded"), done.stderr


def test_the_manpage_renders(offline: Cli, tmp_path: Path) -> None:
    page = offline("manpage").out
    assert page.startswith(".TH LOCKWARDEN 1")
    for command in ("run", "hold", "status", "break", "clean", "permits", "init"):
        assert f".SS {command}\n" in page
    for section in ("NAME", "SYNOPSIS", "COMMANDS", "COMMON OPTIONS", "EXIT STATUS"):
        assert f".SH {section}\n" in page
    source = tmp_path / "lockwarden.1"
    source.write_text(page)
    if shutil.which("groff"):  # valid roff: no warning at the strictest level
        checked = subprocess.run(
            ["groff", "-man", "-ww", "-z", str(source)], capture_output=True, text=True, check=True
        )
        assert checked.stderr == ""
    if shutil.which("man"):
        shown = subprocess.run(
            ["man", "-l", str(source)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "MANPAGER": "cat", "MANWIDTH": "100"},
        ).stdout
        assert "lockwarden run [options] NAME -- CMD [ARGS...]" in shown
        assert "--wait SECONDS" in shown and "LOCKWARDEN_DB" in shown


BACKENDS = ("SQLite", "PostgreSQL", "MariaDB/MySQL", "etcd")


def test_the_help_the_manpage_and_the_package_name_every_backend(offline: Cli) -> None:
    """They named SQLite and PostgreSQL only."""
    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    page = offline("manpage").out
    name_line = page.split(".SH NAME\n", 1)[1].splitlines()[0]
    texts = {
        "--help": offline("--help").out,
        "run --help": offline("run", "--help").out,
        "the man page's NAME": name_line,
        "the man page's DESCRIPTION": page.split(".SH DESCRIPTION\n", 1)[1].split(".SH", 1)[0],
        "lockwarden": lockwarden.__doc__ or "",
        "lockwarden.store": lockwarden.store.__doc__ or "",
        "pyproject.toml": meta["description"],
    }
    for where, text in texts.items():
        flat = " ".join(text.split())
        assert all(backend in flat for backend in BACKENDS), (where, text)
    assert "mysql://user@host:3306/db" in texts["--help"]
    assert "etcd://host:2379" in texts["--help"]
