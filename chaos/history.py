"""The history of a run: one JSON object per line, appended by every process.

Each worker, the nemesis and the controller open the same file with
``O_APPEND`` and write each record with a single ``write(2)``, so records of
different processes never interleave within a line and need no lock. A
process killed mid-run loses at most the record it had not written yet;
the checker treats an operation without a completion as one whose outcome
is unknown (Jepsen's "info"), which is exactly what it is.

Times are ``time.monotonic()``: on Linux one clock for every process of the
host, so records of different processes can be ordered.

Record types (field ``type``):

- ``run`` — the configuration, first line;
- ``process`` — a worker opened a session: a new logical process (``process``,
  ``slot``, ``pid``); ``retire`` — it gave the session up (``reason``);
- ``invoke`` / ``ok`` / ``fail`` / ``info`` — an operation ``f`` (``acquire``,
  ``read``, ``write``, ``release``) of a ``process``, numbered ``op``: invoked,
  then known done, known not done, or unknown;
- ``lost`` — the library told a process (its session's ``on_lost``) that its
  session was lost (``reason``, the lease's ``deadline``); ``stopped`` — a
  process stopped acting under the locks it held (``reason``: release,
  lost, refused, unknown; ``told``, ``lease_left``, ``deadline``);
- ``fault`` — the nemesis acted (``fault``: kill, pause, resume, kill-writer,
  terminate, restart, partition, heal, member-kill, member-cut, ...;
  ``slot``/``pid`` of the target, ``slots`` of a partition);
- ``end`` — the controller killed every worker; ``final`` — what the store
  and the registers held after the run and ``Store.clean()``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

Record = dict[str, Any]


class HistoryWriter:
    """Appends records to a history file; safe to use from several processes at once."""

    def __init__(self, path: str | Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, type: str, **fields: Any) -> float:
        """Append one record stamped with the monotonic clock; returns the stamp."""
        now = time.monotonic()
        line = json.dumps({"type": type, "time": now, **fields}, separators=(",", ":"))
        os.write(self._fd, line.encode() + b"\n")
        return now

    def close(self) -> None:
        os.close(self._fd)


def load_history(path: str | Path) -> tuple[list[Record], int]:
    """The records of a history file in file order, and how many lines did not parse.

    A line that does not parse could only be the write of a process killed
    while writing it; it is skipped (its operation stays without completion)
    and counted, so that the checker can say so.
    """
    records: list[Record] = []
    skipped = 0
    with open(path, encoding="utf-8") as file:
        for line in file:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                skipped += 1
    return records, skipped
