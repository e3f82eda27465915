"""The harness's short run, as CI runs it: 60 s with seed 7 on each backend, no violation.

The runs start together (each in a store of its own: an SQLite file in a
temporary directory, a PostgreSQL schema of its own, a private etcd cluster
whose members the nemesis kills, pauses and cuts off) and take about 65 s of
wall time in all; they are light (mostly sleeping workers). On PostgreSQL and
etcd each worker reaches the store through proxies of its own, which the
nemesis freezes (partitions). No PostgreSQL restarts here: the server is
shared. (MariaDB's run, `--backend mysql`, is not among
them yet: a fourth run at once left the SQLite run short of its minimum of
grants on the shared 2-core machine.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.check import SAFETY
from chaos.run import LEASE_RENEWED, ROOT

pytestmark = pytest.mark.slow

DURATION, SEED = 60, 7
BACKENDS = ("sqlite", "postgres", "etcd")
MIN_ACQUIRES = {"sqlite": 300, "postgres": 300, "etcd": 150}
"""Grants a run must make to count as having done work: on etcd every write waits for a
quorum's fsync and a killed or paused member costs a timeout, so fewer loops fit."""


FAULT_EVERY = {"sqlite": 3.0, "postgres": 3.0, "etcd": 1.5}
"""Mean seconds between faults (`--fault-every`). Half of etcd's faults hit cluster members:
at the default of 3 s, 60 s runs killed or paused workers 6 or 7 times, and a write holder
with a waiter behind it 0 to 2 times (0 fails the run); at 1.5 s, 10 and 7 times."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """Start one run per backend at once; each test waits for its own."""
    directory = tmp_path_factory.mktemp("chaos")
    started = {
        backend: subprocess.Popen(
            [
                *(sys.executable, "-m", "chaos", "--backend", backend),
                *("--duration", str(DURATION), "--seed", str(SEED)),
                *("--fault-every", str(FAULT_EVERY[backend])),
                *("--history", str(directory / f"{backend}.jsonl")),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for backend in BACKENDS
    }
    yield started
    for proc in started.values():
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_short_run_under_faults_finds_no_violation(
    runs: dict[str, subprocess.Popen[str]], backend: str
) -> None:
    proc = runs[backend]
    output, _ = proc.communicate(timeout=DURATION + 60)
    history = Path(proc.args[-1])  # type: ignore[index]
    summary: dict[str, Any] = json.loads(history.with_suffix(".summary.json").read_text())
    assert proc.returncode == 0, output
    assert summary["safe"] and summary["valid"], output
    assert summary["violations"] == dict.fromkeys(SAFETY, 0)
    # The run did work and the nemesis did its job...
    assert summary["operations"]["acquire"]["ok"] > MIN_ACQUIRES[backend], output
    held = summary["holding"]
    if backend != "sqlite":  # partitions, and the holders' local deadlines, at work
        assert held["partitions"] >= 1, output
    # (a worker cut off alone by a partition is dead to the others, as a paused one)
    alone = held["partitions"] - held["partitions_of_every_worker"]
    deaths = alone + sum(
        summary["faults"].get(kind, 0) for kind in ("kill", "kill-writer", "pause")
    )
    assert deaths >= 5, output
    # ...and a dead holder's locks came free in about a TTL (the waiter looks again then;
    # a multi-lock next in line may also wait for another name whose holder died later).
    live = summary["liveness"]
    # How many deaths hit a write holder with a waiter behind it depends on timing,
    # not only on the seed: 2 to 8 seen in 60 s alone, and 0 once with the suite's other
    # workers beside it. What is measured must be in bounds; the dead holder's lock
    # passing on in about a TTL is also tested head-on, on every backend
    # (tests/cli/test_run.py, a killed holder's lock passing on after the TTL).
    if live["recoveries"]:
        # (a holder paused just before a new etcd leader may keep its lease that much longer)
        assert live["p50"] <= 1.25 * live["ttl"] + LEASE_RENEWED.get(backend, 0.0), output
        assert live["max_in_ttls"] <= 3.0, output
