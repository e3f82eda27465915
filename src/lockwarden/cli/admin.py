"""The administrator's commands: break, clean, permits, init.

Each is a thin layer over one public call of the store; what this module adds
is presentation (a line for people, a JSON object for scripts) and the
safety catch on `break`. Only `init` creates a store: the others, pointed at
a wrong path or schema, say there is no store there (status 69) instead of
making an empty one and reporting that nothing is held.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from lockwarden.cli.common import EX_UNAVAILABLE, EX_USAGE, CliError, emit, open_store
from lockwarden.cli.terminal import printable

if TYPE_CHECKING:
    from lockwarden.store import LockEntry


def break_lock(args: argparse.Namespace, url: str) -> int:
    """Remove every holder of a name (bumping the token), after a confirmation."""
    if not args.yes and not sys.stdin.isatty():
        raise CliError(
            EX_USAGE,
            f"refusing to break {args.name!r} without confirmation: standard input is not "
            "a terminal; add --yes",
        )
    with open_store(url, create=False) as store:
        holders = store.locks(args.name)
        if not holders:
            emit(args, f"{args.name!r} is not held: nothing to break", _broke(args.name, 0))
            return 0
        if not args.yes:
            _confirm(args.name, holders, f"break the lock on {args.name!r}?")
        removed = store.break_lock(args.name)
    emit(
        args,
        f"broke {args.name!r}: removed {_count(removed, 'holder')}; "
        "the next holder gets a larger fencing token",
        _broke(args.name, removed),
    )
    return 0


def _broke(name: str, removed: int) -> dict[str, object]:
    return {"name": name, "removed": removed}


def _confirm(name: str, holders: list[LockEntry], question: str) -> None:
    for e in holders:
        line = f"{name!r} is held ({e.mode.word}) by {e.holder}"
        print(printable(line), file=sys.stderr)
    print(printable(f"{question} [y/N] "), end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise CliError(1, f"{name!r} was left alone")


def clean(args: argparse.Namespace, url: str) -> int:
    """Remove expired sessions, the locks they still had, and dead waiters."""
    with open_store(url, create=False) as store:
        removed = store.clean()
    emit(
        args,
        f"removed {_count(removed.sessions, 'expired session')}, "
        f"{_count(removed.locks, 'lock')} they held and {_count(removed.waiters, 'dead waiter')}",
        removed._asdict(),
    )
    return 0


def permits(args: argparse.Namespace, url: str) -> int:
    """Show a name's permits, or change those given (the others keep their value)."""
    given = {k: v for k, v in vars(args).items() if k in ("read", "write")}  # None: unlimited
    with open_store(url, create=False) as store:
        current = store.permits(args.name)
        if given:
            holders = [e for e in store.locks(args.name) if not e.stale] if args.force else []
            if holders and not args.yes:
                if not sys.stdin.isatty():
                    raise CliError(
                        EX_USAGE,
                        f"refusing to force permits of {args.name!r} without confirmation: "
                        "standard input is not a terminal; add --yes",
                    )
                _confirm(args.name, holders, "apply the new permits now, beside them?")
            store.set_permits(
                args.name,
                **{"read": current.read, "write": current.write, **given},
                force=args.force,
            )
            current = store.permits(args.name)
    read_text = "unlimited" if current.read is None else str(current.read)
    emit(
        args,
        f"{args.name!r}: read {read_text}, write {current.write}",
        {"name": args.name, "read": current.read, "write": current.write},
    )
    return 0


def init(args: argparse.Namespace, url: str) -> int:
    """Create or upgrade the store's tables and say where they are; or, ``--check``, only say."""
    if args.check:
        return _check(args, url)
    with open_store(url, create=True) as store:
        where = store.url
    emit(args, f"lock store ready: {where}", {"database": where})
    return 0


def _check(args: argparse.Namespace, url: str) -> int:
    """What `init` would do, from the versions recorded in the store; nothing is changed."""
    from lockwarden import LockError  # noqa: PLC0415
    from lockwarden.store import check_schema  # noqa: PLC0415
    from lockwarden.store.backends.sql import schema  # noqa: PLC0415

    try:
        plan = check_schema(url)
    except LockError as exc:
        raise CliError(EX_UNAVAILABLE, str(exc)) from exc
    if plan.found is None:
        state = f"no lock store at {plan.url}"
    else:
        state = (
            f"lock store {plan.url} has schema version {plan.found}, usable by lockwarden "
            f"schema versions {plan.usable_from} and newer"
        )
    lines = [state, f"this lockwarden has schema version {schema.SCHEMA_VERSION}"]
    if plan.refusal:
        lines.append(f"this lockwarden cannot use it: {plan.refusal}")
    elif not plan.steps:
        lines.append("nothing to do: no upgrade needed")
    elif plan.found is None:  # every step since the first: the history, not news
        lines.append(
            "init (or any command that takes a lock) would create it at schema version "
            f"{schema.SCHEMA_VERSION}, in one transaction (--json lists the statements)"
        )
    else:
        lines.append("init (or any command that takes a lock) would apply, in one transaction:")
        for version, statements in plan.steps:
            lines.append(
                f"  step to version {version}:"
                if statements
                else f"  step to version {version}: the version number only (no statement)"
            )
            lines.extend(f"    {' '.join(sql.split())}" for sql in statements)
    if args.json:
        emit(
            args,
            "",
            {
                "database": plan.url,
                "found": plan.found,
                "usable_from": plan.usable_from,
                "this_version": schema.SCHEMA_VERSION,
                "usable": plan.refusal is None,
                "steps": [{"version": v, "statements": list(sql)} for v, sql in plan.steps],
            },
        )
    else:
        for line in lines:
            emit(args, line, {})
    return EX_UNAVAILABLE if plan.refusal else 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
