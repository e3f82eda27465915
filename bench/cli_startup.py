"""How long the ``lockwarden`` command takes to start, beside ``python -c pass`` and flock(1).

A shell script or a cron job pays the command's start-up on every call, so
``lockwarden --version`` and ``lockwarden run NAME -- true`` on SQLite are
timed against the floor of any Python program (the same interpreter doing
nothing) and against flock(1), the tool ``run`` replaces on one host.

Each command runs ``--rounds`` times, the commands interleaved round-robin so
that all of them see the same machine; the best and the median wall time are
printed (noise only ever adds time, so the best is the figure to compare).
``--instructions`` also counts the instructions each command executes, under
valgrind: slow, but the same on a busy machine as on a quiet one, so two
versions can be compared anywhere. The package's bytecode is compiled first
(``PYTHONDONTWRITEBYTECODE`` would otherwise leave each run compiling it).
Nothing is written unless ``--json PATH`` is given.

    python bench/cli_startup.py [--rounds 30] [--instructions] [--json PATH]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lockwarden


def _commands(directory: Path) -> dict[str, list[str]]:
    lockwarden = Path(sys.executable).with_name("lockwarden")
    if not lockwarden.exists():
        sys.exit(f"{lockwarden} is missing: pip install -e . first")
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "lockwarden --version": [str(lockwarden), "--version"],
        "lockwarden run x -- true": [str(lockwarden), "run", "x", "--", "true"],
    }
    flock = shutil.which("flock")
    if flock:
        commands["flock FILE true"] = [flock, str(directory / "flock"), "true"]
    return commands


def _time(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _instructions(argv: list[str], env: dict[str, str]) -> float | None:
    """Millions of instructions ``argv`` executes (its own process), or None without valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    done = subprocess.run(
        [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    return int(found.group(1)) / 1e6 if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="runs of each command")
    parser.add_argument(
        "--instructions", action="store_true", help="also count instructions (valgrind)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    options = parser.parse_args()
    compileall.compile_dir(Path(lockwarden.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory(prefix="lw-cli-startup-") as tmp:
        directory = Path(tmp)
        env = {**os.environ, "LOCKWARDEN_DB": f"sqlite:///{directory / 'locks.db'}"}
        commands = _commands(directory)
        _time(commands["lockwarden run x -- true"], env)  # creates the store: not timed
        times: dict[str, list[float]] = {label: [] for label in commands}
        for _ in range(options.rounds):
            for label, argv in commands.items():
                times[label].append(_time(argv, env))
        counted = {
            label: _instructions(argv, env) if options.instructions else None
            for label, argv in commands.items()
        }
    floor = min(times["python -c pass"])
    figures = {
        label: {
            "best_ms": round(min(ts) * 1000, 1),
            "median_ms": round(statistics.median(ts) * 1000, 1),
            "above_python_ms": round((min(ts) - floor) * 1000, 1),
            "instructions_millions": None if counted[label] is None else round(counted[label], 1),
        }
        for label, ts in times.items()
    }
    load = os.getloadavg()[0]
    print(f"{'command':<28} {'best':>8} {'median':>8} {'above python':>13} {'instructions':>13}")
    for label, f in figures.items():
        count = f["instructions_millions"]
        print(
            f"{label:<28} {f['best_ms']:>6.1f}ms {f['median_ms']:>6.1f}ms "
            f"{f['above_python_ms']:>11.1f}ms {'' if count is None else f'{count:>11.0f} M'}"
        )
    print(f"({options.rounds} rounds; load average {load:.2f}: figures on a busy machine mislead)")
    if options.json:
        record = {"rounds": options.rounds, "load_average": load, "commands": figures}
        options.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
