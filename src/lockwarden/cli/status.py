"""`lockwarden status`: the locks held and the requests waiting, for people or for scripts.

The table escapes every name, app id and host (`terminal.printable`): they
are chosen by whoever takes a lock, and the administrator's terminal must
not run their escape sequences. The JSON shape is stable (docs/cli.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from lockwarden.cli.common import JSON_FORMAT, open_store
from lockwarden.cli.terminal import printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from lockwarden.store import LockEntry, Store, WaiterEntry


def status(args: argparse.Namespace, url: str) -> int:
    """Locks and waiters whose names start with the prefix: a table, or JSON; or, with
    ``--watch``, the same again and again until interrupted."""
    if args.watch is not None:
        return _watch(args, url)
    with open_store(url, create=False) as store:
        locks = [e for e in store.locks() if e.name.startswith(args.prefix)]
        waiters = [w for w in store.waiters() if w.name.startswith(args.prefix)]
        where = store.url
    if args.json:
        print(json.dumps(_shape(where, locks, waiters), indent=2))
    else:
        # Piped into grep or a file, rows stay whole instead of wrapping at 80 columns.
        from rich.console import Console  # noqa: PLC0415 - rich: only for this command

        console = Console() if sys.stdout.isatty() else Console(width=100_000)
        for part in _view(where, locks, waiters, Counter(w.name for w in waiters)):
            console.print(part)
    return 0


def _shape(where: str, locks: list[LockEntry], waiters: list[WaiterEntry]) -> dict[str, Any]:
    """What ``status --json`` prints (docs/cli.md): one object."""
    queued = Counter(w.name for w in waiters)
    return {
        "format": JSON_FORMAT,
        "database": where,
        "locks": [_lock_json(e, queued[e.name]) for e in locks],
        "waiters": [_waiter_json(w) for w in waiters],
    }


def _lock_json(entry: LockEntry, waiters: int) -> dict[str, Any]:
    holder = entry.holder
    return {
        "name": entry.name,
        "mode": entry.mode.word,
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
        "mode": entry.mode.word,
        "session_id": entry.session_id,
        "app_id": entry.app_id,
        "host": entry.host,
        "pid": entry.pid,
        "waited_for": round(entry.waited_for, 3),
        "expires_in": None if entry.expires_in is None else round(entry.expires_in, 3),
        "stale": entry.stale,
    }


def _watch(args: argparse.Namespace, url: str) -> int:
    """`status --watch`, until Ctrl-C: on a terminal, the tables redrawn every
    ``args.watch`` seconds with any cycle of waits named (the terminal form of
    `lockwarden dashboard`); into a pipe or a file, each frame printed after the
    last, with its time, and flushed at once; with ``--json``, one ``status --json``
    object per line (JSON Lines), flushed at once."""
    with open_store(url, create=False) as store:
        try:
            (_json_lines if args.json else _frames)(args, store)
        except KeyboardInterrupt:
            return 0


def _json_lines(args: argparse.Namespace, store: Store) -> NoReturn:
    """`status --watch --json`: one line per look, the shape of `status --json`."""
    while True:
        locks = [e for e in store.locks() if e.name.startswith(args.prefix)]
        waiters = [w for w in store.waiters() if w.name.startswith(args.prefix)]
        print(json.dumps(_shape(store.url, locks, waiters)), flush=True)
        time.sleep(args.watch)


def _frames(args: argparse.Namespace, store: Store) -> NoReturn:
    """The text frames of `_watch`: redrawn in place on a terminal, else one after another."""
    from rich.console import Console, Group  # noqa: PLC0415
    from rich.live import Live  # noqa: PLC0415

    from lockwarden.observe import Snapshot  # noqa: PLC0415

    def frame() -> list[RenderableType]:
        snap = Snapshot.take(store).only(args.prefix)
        queued = Counter(w.name for w in snap.waiters)
        parts = _view(store.url, snap.locks, snap.waiters, queued)
        for members in snap.cycles:
            ids = ", ".join(m[:8] for m in members)
            parts.append(_text(f"cycle of waits (deadlock) between sessions {ids}"))
        return parts

    if sys.stdout.isatty():
        with Live(console=Console(), screen=False) as live:
            while True:
                live.update(Group(*frame()))
                time.sleep(args.watch)
    # A pipe or a file: nothing to redraw, and rich's Live would print only at the end.
    from rich.text import Text  # noqa: PLC0415

    console = Console(width=100_000)
    while True:
        parts = frame()
        console.print(Text(time.strftime("%Y-%m-%d %H:%M:%S %z")), *parts, sep="\n")
        console.print()
        sys.stdout.flush()
        time.sleep(args.watch)


def _text(line: str) -> RenderableType:
    from rich.text import Text  # noqa: PLC0415

    return Text(printable(line), "bold red")


def _view(
    where: str, locks: list[LockEntry], waiters: list[WaiterEntry], queued: Counter[str]
) -> list[RenderableType]:
    """What `status` shows, as rich renderables: the locks, then the queue."""
    # rich costs tens of milliseconds to import: only this command pays for it.
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
        shown = Table(title=Text(title), title_justify="left", highlight=False)
        for column in columns:
            shown.add_column(column, no_wrap=column not in ("NAME", "APP", "HOST"))
        for row in rows:
            # Text, not markup: a lock name like "batch[1]" is shown as it is.
            cells = zip(columns, row, strict=True)
            shown.add_row(*(Text(printable(cell), _style(column, cell)) for column, cell in cells))
        return shown

    if not locks and not waiters:
        return [Text(printable(f"no locks held in {where}"))]
    held = [
        (
            e.name,
            e.mode.word,
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
    parts: list[RenderableType] = [table(printable(f"locks in {where}"), columns, held)]
    if waiters:
        queue = [
            (
                w.name,
                w.mode.word,
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
        parts.append(table("waiting, in queue order", columns, queue))
    return parts


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
