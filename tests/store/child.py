"""A process taking part in the store's multi-process tests.

Run as ``python child.py ROLE URL ...``; it reports on stdout and takes
commands on stdin, one JSON object or word per line. With ``LW_SKEW=<seconds>``
in its environment, its wall clock (time.time and datetime) is that far off, and a
holder's ``step <seconds>`` command moves it further, at once, as an administrator's
``date -s`` or a bad NTP server would (the monotonic clock never jumps).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SKEW = [0.0]
"""Seconds the wall clock is off (`skew_clock`); a ``step`` adds to it."""


def skew_clock(seconds: float) -> None:
    SKEW[0] = seconds
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + SKEW[0]
    time.time_ns = lambda: real_time_ns() + int(SKEW[0] * 1e9)

    class SkewedDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return super().now(tz) + datetime.timedelta(seconds=SKEW[0])

        @classmethod
        def utcnow(cls) -> Any:
            return super().now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(
                seconds=SKEW[0]
            )

    datetime.datetime = SkewedDatetime  # type: ignore[misc]


def say(**message: Any) -> None:
    print(json.dumps(message), flush=True)


def counter(store: Any, path: str, rounds: int) -> None:
    """Increment an unguarded counter file under a write lock."""
    with store.session(app_id="counter", ttl=5.0) as session:
        for _ in range(rounds):
            with session.lock("counter", timeout=60):
                file = Path(path)
                value = int(file.read_text())
                file.write_text(str(value + 1))
    say(event="done")


def holder(store: Any, name: str, ttl: float) -> None:
    """Hold a lock, then obey commands: check, on_lost, release, exit."""
    import lockwarden  # noqa: PLC0415

    lost: list[Any] = []
    session = store.session(app_id="holder", ttl=ttl, on_lost=lost.append)
    lock = session.lock(name, timeout=30)
    say(event="locked", token=lock.token, pid=os.getpid(), session=session.id)
    for line in sys.stdin:
        command = line.strip()
        try:
            if command == "check":
                lock.check()
                say(held=True)
            elif command == "on_lost":
                deadline = time.monotonic() + 5
                while not lost and time.monotonic() < deadline:
                    time.sleep(0.01)
                say(fired=len(lost))
            elif command == "release":
                lock.release()
                say(released=True)
            elif command.startswith("step "):
                SKEW[0] += float(command.split()[1])
                say(skew=SKEW[0])
            elif command == "exit":
                break
        except lockwarden.LockLost as exc:
            say(lost=str(exc))
    say(event="bye")


def waiter(store: Any, name: str, timeout: float) -> None:
    """Try to take a lock; report what happened."""
    import lockwarden  # noqa: PLC0415

    with store.session(app_id="waiter", ttl=1.0) as session:
        try:
            lock = session.lock(name, timeout=timeout)
        except lockwarden.LockError as exc:
            say(event="failed", error=type(exc).__name__)
        else:
            say(event="locked", token=lock.token)
            lock.release()


def contender(store: Any, name: str, seconds: float) -> None:
    """On "go", take and release a lock over and over for ``seconds``; report the tokens."""
    with store.session(app_id="contender", ttl=10.0) as session:
        say(event="ready")
        sys.stdin.readline()
        tokens = []
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            with session.lock(name, timeout=30) as lock:
                tokens.append(lock.token)
        say(event="done", tokens=tokens)


def main() -> None:
    role, url, *args = sys.argv[1:]
    if os.environ.get("LW_SKEW"):
        skew_clock(float(os.environ["LW_SKEW"]))
    import lockwarden  # noqa: PLC0415  (after the clock is skewed)

    store = lockwarden.connect(url)
    try:
        if role == "counter":
            counter(store, args[0], int(args[1]))
        elif role == "holder":
            holder(store, args[0], float(args[1]))
        elif role == "contender":
            contender(store, args[0], float(args[1]))
        elif role == "waiter":
            waiter(store, args[0], float(args[1]))
        else:
            raise SystemExit(f"unknown role {role}")
    finally:
        store.close()


if __name__ == "__main__":
    main()
