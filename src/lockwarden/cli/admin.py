"""The administrator's commands: status, break, clean, permits, init (DESIGN C2).

Each is a thin layer over one public call of the store; what this module adds
is presentation (a table for people, a stable JSON shape for scripts) and
the safety catch on `break`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from lockwarden.cli.common import EX_USAGE, CliError, mode_word, open_store
from lockwarden.store import LockEntry, WaiterEntry

JSON_FORMAT = 1
"""The version of `status --json`'s shape (docs/cli.md); a field removed or changed bumps it."""


def status(args: argparse.Namespace, url: str) -> int:
    """Locks and waiters whose names start with the prefix: a table, or JSON."""
    with open_store(url) as store:
        locks = [e for e in store.locks() if e.name.startswith(args.prefix)]
        waiters = [w for w in store.waiters() if w.name.startswith(args.prefix)]
        where = store.url
    queued = Counter(w.name for w in waiters)
    if args.json:
        shape = {
            "format": JSON_FORMAT,
            "database": where,
            "locks": [_lock_json(e, queued[e.name]) for e in locks],
            "waiters": [_waiter_json(w) for w in waiters],
        }
        print(json.dumps(shape, indent=2))
    else:
        _tables(where, locks, waiters, queued)
    return 0


def _lock_json(entry: LockEntry, waiters: int) -> dict[str, Any]:
    holder = entry.holder
    return {
        "name": entry.name,
        "mode": mode_word(entry.mode),
        "token": entry.token,
        "session_id": holder.session_id,
        "app_id": holder.app_id,
        "host": holder.host,
        "pid": holder.pid,
        "held_for": round(holder.held_for, 3),
        "heartbeat_age": round(holder.heartbeat_age, 3),
        "stale": entry.stale,
        "waiters": waiters,
    }


def _waiter_json(entry: WaiterEntry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "mode": mode_word(entry.mode),
        "session_id": entry.session_id,
        "app_id": entry.app_id,
        "host": entry.host,
        "pid": entry.pid,
        "waited_for": round(entry.waited_for, 3),
        "expires_in": None if entry.expires_in is None else round(entry.expires_in, 3),
        "stale": entry.stale,
    }


def _tables(
    where: str, locks: list[LockEntry], waiters: list[WaiterEntry], queued: Counter[str]
) -> None:
    # rich costs tens of milliseconds to import: only this command pays for it.
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
        shown = Table(title=Text(title), title_justify="left", highlight=False)
        for column in columns:
            shown.add_column(column, no_wrap=column not in ("NAME", "APP", "HOST"))
        for row in rows:
            # Text, not markup: a lock name like "batch[1]" is shown as it is.
            cells = zip(columns, row, strict=True)
            shown.add_row(*(Text(cell, _style(column, cell)) for column, cell in cells))
        return shown

    # Piped into grep or a file, rows stay whole instead of wrapping at 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=100_000)
    if not locks and not waiters:
        console.print(Text(f"no locks held in {where}"))
        return
    held = [
        (
            e.name,
            mode_word(e.mode),
            str(e.token),
            e.holder.app_id,
            e.holder.host,
            str(e.holder.pid),
            _age(e.holder.held_for),
            _age(e.holder.heartbeat_age),
            "STALE" if e.stale else "live",
            str(queued[e.name] or ""),
        )
        for e in locks
    ]
    columns = [
        "NAME",
        "MODE",
        "TOKEN",
        "APP",
        "HOST",
        "PID",
        "HELD",
        "HEARTBEAT",
        "STATE",
        "WAITERS",
    ]
    console.print(table(f"locks in {where}", columns, held))
    if waiters:
        queue = [
            (
                w.name,
                mode_word(w.mode),
                w.app_id,
                w.host,
                str(w.pid),
                _age(w.waited_for),
                "never" if w.expires_in is None else _age(w.expires_in),
                "STALE" if w.stale else "waiting",
            )
            for w in waiters
        ]
        columns = ["NAME", "MODE", "APP", "HOST", "PID", "WAITED", "GIVES UP IN", "STATE"]
        console.print(table("waiting, in queue order", columns, queue))


def _style(column: str, cell: str) -> str:
    return "bold red" if (column, cell) == ("STATE", "STALE") else ""


def _age(seconds: float) -> str:
    """12.3s, 4m05s, 2h07m: short enough for a table column."""
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def break_lock(args: argparse.Namespace, url: str) -> int:
    """Remove every holder of a name (bumping the token), after a confirmation."""
    if not args.yes and not sys.stdin.isatty():
        raise CliError(
            EX_USAGE,
            f"refusing to break {args.name!r} without confirmation: standard input is not "
            "a terminal; add --yes",
        )
    with open_store(url) as store:
        holders = store.locks(args.name)
        if not holders:
            print(f"{args.name!r} is not held: nothing to break")
            return 0
        if not args.yes:
            _confirm(args.name, holders)
        removed = store.break_lock(args.name)
    print(
        f"broke {args.name!r}: removed {_count(removed, 'holder')}; "
        "the next holder gets a larger fencing token"
    )
    return 0


def _confirm(name: str, holders: list[LockEntry]) -> None:
    for e in holders:
        print(f"{name!r} is held ({mode_word(e.mode)}) by {e.holder}", file=sys.stderr)
    print(f"break the lock on {name!r}? [y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise CliError(1, f"{name!r} was left alone")


def clean(args: argparse.Namespace, url: str) -> int:
    """Remove expired sessions, the locks they still had, and dead waiters."""
    with open_store(url) as store:
        removed = store.clean()
    print(
        f"removed {_count(removed.sessions, 'expired session')}, "
        f"{_count(removed.holders, 'lock')} they held and {_count(removed.waiters, 'dead waiter')}"
    )
    return 0


def permits(args: argparse.Namespace, url: str) -> int:
    """Show a name's permits, or change those given (the others keep their value)."""
    with open_store(url) as store:
        current = store.permits(args.name)
        given = {k: v for k, v in vars(args).items() if k in ("read", "write")}  # None: unlimited
        if given:
            store.set_permits(args.name, **{"read": current.read, "write": current.write, **given})
            current = store.permits(args.name)
    read_text = "unlimited" if current.read is None else str(current.read)
    print(f"{args.name!r}: read {read_text}, write {current.write}")
    return 0


def init(args: argparse.Namespace, url: str) -> int:
    """Create or upgrade the store's tables, and say where they are."""
    with open_store(url) as store:
        print(f"lock store ready: {store.url}")
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
