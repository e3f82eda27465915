"""`lockwarden completion SHELL` and `lockwarden manpage`: lockwarden described by its own parser.

Both are made from `main.parser`, the one place every command and option is
declared, so neither can fall out of step with the help text.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

from lockwarden import __version__


@dataclass(frozen=True)
class _Command:
    name: str
    parser: argparse.ArgumentParser
    options: tuple[argparse.Action, ...]
    positionals: tuple[argparse.Action, ...]


def _commands(top: argparse.ArgumentParser) -> list[_Command]:
    found = []
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                options = tuple(a for a in sub._actions if a.option_strings)
                positionals = tuple(a for a in sub._actions if not a.option_strings)
                found.append(_Command(name, sub, options, positionals))
    return found


def _top() -> argparse.ArgumentParser:
    from lockwarden.cli.main import parser  # noqa: PLC0415  (main imports this module lazily)

    return parser()


# -- completion -------------------------------------------------------------------

_BASH = """\
# bash completion for lockwarden (made by `lockwarden completion bash`)
_lockwarden() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} cmd= skip= i w
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${{COMP_WORDS[i]}}
        if [[ -n $skip ]]; then skip=; continue; fi
        case $w in
            --)  # CMD of `lockwarden run`: a command, then its own arguments
                if ((i == COMP_CWORD - 1)); then COMPREPLY=($(compgen -c -- "$cur")); fi
                return 0;;
            {valued}) skip=1;;
            -*) ;;
            *) if [[ -z $cmd ]]; then cmd=$w; fi;;
        esac
    done
    local words
    case $cmd in
{cases}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _lockwarden lockwarden
"""


def completion_script(shell: str, top: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` ("bash" or "zsh", which runs bash's)."""
    commands = _commands(top)
    valued = sorted(
        {
            option
            for command in commands
            for action in command.options
            if action.nargs != 0
            for option in action.option_strings
        }
    )
    top_words = [c.name for c in commands] + [
        o for a in top._actions if a.option_strings for o in a.option_strings
    ]
    cases = [f'        "") words={shlex.quote(" ".join(top_words))};;']
    for command in commands:
        words = [o for a in command.options for o in a.option_strings]
        words += [str(c) for a in command.positionals for c in (a.choices or ())]
        cases.append(f"        {command.name}) words={shlex.quote(' '.join(words))};;")
    script = _BASH.format(valued="|".join(valued), cases="\n".join(cases))
    if shell == "zsh":
        return (
            "#compdef lockwarden\n"
            "# zsh completion for lockwarden (made by `lockwarden completion zsh`)\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + script
        )
    return script


def completion(args: argparse.Namespace, url: str) -> int:
    """The `completion` command."""
    print(completion_script(args.shell, _top()), end="")
    return 0


# -- the manual page --------------------------------------------------------------


def _roff(text: str) -> str:
    """Text as roff shows it literally: backslashes, hyphens and line-leading dots escaped."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        f"\\&{line}" if line.startswith((".", "'")) else line for line in text.split("\n")
    )


def _option(action: argparse.Action) -> str:
    names = ", ".join(f"\\fB{_roff(o)}\\fR" for o in action.option_strings)
    if action.nargs != 0:
        names += f" \\fI{_roff(str(action.metavar or action.dest.upper()))}\\fR"
    return f".TP\n{names}\n{_roff(action.help or '')}"


def _summary(description: str) -> str:
    """The top description as the NAME line wants it: one line, lower case first, no
    full stop (the backends' names keep their capitals)."""
    line = " ".join(description.split()).rstrip(".")
    return line[:1].lower() + line[1:]


def manpage_text(top: argparse.ArgumentParser) -> str:
    """The manual page in roff (man(7) macros)."""
    commands = _commands(top)
    common = {o for a in top._actions if a.option_strings for o in a.option_strings}
    out = [
        f'.TH LOCKWARDEN 1 "" "lockwarden {__version__}" "User Commands"',
        ".SH NAME",
        f"lockwarden \\- {_roff(_summary(top.description or ''))}",
        ".SH SYNOPSIS",
        ".nf",
        *(_roff(c.parser.format_usage().removeprefix("usage: ").strip()) for c in commands),
        ".fi",
        ".SH DESCRIPTION",
        "Locks shared by processes on one host (SQLite) or a fleet of hosts (PostgreSQL, "
        "MariaDB/MySQL or an etcd cluster), with leases, heartbeats and fencing tokens. "
        "Every command takes the options "
        "under \\fBCOMMON OPTIONS\\fR, before or after its name.",
        ".SH COMMANDS",
    ]
    for c in commands:
        out.append(f".SS {c.name}")
        out.append(_roff(c.parser.description or ""))
        for action in c.positionals:
            out.append(
                f".TP\n\\fI{_roff(str(action.metavar or action.dest))}\\fR\n"
                f"{_roff(action.help or '')}"
            )
        out.extend(
            _option(a)
            for a in c.options
            if not set(a.option_strings) & common and "--help" not in a.option_strings
        )
        if c.parser.epilog and c.name not in ("run", "hold"):
            out.extend((".PP", ".nf", _roff(c.parser.epilog), ".fi"))
    run = next(c for c in commands if c.name == "run")
    hold = next(c for c in commands if c.name == "hold")
    for c in (run, hold):
        notes = (c.parser.epilog or "").split("\n\n")[0]
        out.extend((f".SS Notes on {c.name}", ".nf", _roff(notes), ".fi"))
    out.append(".SH COMMON OPTIONS")
    out.extend(_option(a) for a in top._actions if a.option_strings)
    database, statuses = (top.epilog or "").split("\n\n", 1)
    out.extend((".SH ENVIRONMENT", ".TP", "\\fBLOCKWARDEN_DB\\fR", _roff(database)))
    out.extend((".SH EXIT STATUS", ".nf", _roff(statuses), ".fi"))
    out.extend((".SH SEE ALSO", "\\fBflock\\fR(1); docs/cli.md in the lockwarden sources."))
    return "\n".join(out) + "\n"


def manpage(args: argparse.Namespace, url: str) -> int:
    """The `manpage` command."""
    print(manpage_text(_top()), end="")
    return 0
