"""Lock escalation: many row locks under one parent replaced by one lock on the parent.

When an owner holds more than ``escalation_threshold`` locks under one parent
of the last level (the keys of indexes on that table count as its rows), it
tries, never waits, to take the join of what the parent holds with S (all
rows read) or X (some row written) and drop the rows. If that would wait,
the rows stay and the next try comes ``escalation_retry`` rows later.

The try comes once the call that crossed the threshold has succeeded
(``_call.py``, and the uncontended path of ``_txn.py``), so no call ever has
to undo an escalation. It cannot strand a waiter (README.md, "Escalation").
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from lockwarden.local._kinds import DATA, RANGE
from lockwarden.local._queue import Owner, Request
from lockwarden.local._table import LockTable
from lockwarden.modes import Mode

_ROW_TABLES = (DATA, RANGE)


def maybe_escalate(
    table: LockTable, owner: Owner, parent: Request[Mode], parent_key: tuple[Hashable, ...]
) -> None:
    """Escalate a parent of rows holding more than the threshold, retrying now and then."""
    if len(parent_key) == table._depth - 1 and parent.children >= owner._escalate_at.get(
        id(parent), 0
    ):
        _escalate(table, owner, parent, parent_key)


def _escalate(
    table: LockTable, owner: Owner, parent: Request[Mode], parent_key: tuple[Hashable, ...]
) -> None:
    """Try (never wait) to replace the rows under `parent` by one S or X lock on it.

    S on the table gives every read a range lock gives (no other owner can
    insert or write without IX), X everything.
    """
    assert parent.mode is not None
    queue = parent.queue or table._queue(parent_key)  # a solo parent gets its queue now
    rows: list[tuple[dict[Any, Request[Any]], Any, Request[Any]]] = [
        (books, key, row)
        for books in map(owner._books, _ROW_TABLES)
        for key, row in books.items()
        if row.parent is parent
    ]
    writes = any(row.mode is not None and row.mode.parent_intention is Mode.IX for *_, row in rows)
    target = parent.mode.join(Mode.X if writes else Mode.S)
    if queue.blocked_on_arrival(parent, target):
        owner._escalate_at[id(parent)] = parent.children + table._settings.escalation_retry
        return
    queue.add_granted(parent, target)
    table._escalations += 1
    for books, key, row in rows:
        del books[key]
        row.parent = None
        row_queue = row.queue
        if row_queue is None:  # a solo lock
            del table._queues[key]
        else:
            row_queue.remove_granted(row)
            table._wake_granted(row_queue)
    parent.children = 0
    owner._escalate_at.pop(id(parent), None)
