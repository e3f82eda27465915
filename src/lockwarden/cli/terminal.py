"""What reaches a person: text with its control characters escaped, and the one-line failure.

Lock names, app ids and host names are chosen by whoever takes a lock. Shown
raw, an escape sequence in one could clear the administrator's screen, move
the cursor to fake a row of ``status``, retitle the window, or hide the rest
of a line behind a carriage return. So every text lockwarden prints for
people goes through `printable`, which shows each character that is not
printable (C0 and C1 controls, ESC, DEL, bidirectional overrides and other
format characters) as a Python escape: ``\\x1b``, ``\\r``, ``\\u202e``.
JSON output needs no such step: the encoder escapes control characters.
"""

from __future__ import annotations

import sys


def printable(text: str) -> str:
    """``text`` with every non-printable character (but the space) written as an escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def one_line(message: object) -> str:
    """``message`` as one escaped line: its lines joined by "; ".

    Operators grep logs and cron mails line by line; a message split over
    lines (a driver's error often is) gets lost or misread there.
    """
    return printable(_joined(message))


def _joined(message: object) -> str:
    # Split at newlines only: a carriage return or other control character
    # inside a name is part of the name, to be shown escaped.
    return "; ".join(part.strip(" ") for part in str(message).split("\n") if part.strip(" "))


def say(
    message: object,
    prog: str = "lockwarden",
    *,
    status: int | None = None,
    as_json: bool = False,
) -> None:
    """Write ``message`` to stderr as exactly one line: text, or with ``--json`` an object.

    ``status`` is the exit status a failure ends with (None: a notice, and the
    command goes on). The JSON form carries the message unescaped; the
    encoder escapes it.
    """
    if as_json:
        import json  # noqa: PLC0415  (only with --json: `--version` and `run` start without it)

        key = "error" if status is not None else "notice"
        shape = {"format": 1, key: _joined(message), "prog": prog, "status": status}
        print(json.dumps(shape), file=sys.stderr, flush=True)
    else:
        print(f"{prog}: {one_line(message)}", file=sys.stderr, flush=True)
