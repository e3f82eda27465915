"""The store benchmark's harness, end to end at toy sizes, on what needs no bench extras.

Figures mean nothing here; what is checked is that every measure still runs
against the store's public API (and the SQLite floor), in this process and in
child processes, and that the report renders. The real run is
``python bench/store.py`` (see bench/README.md).
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import measures  # noqa: E402
import report  # noqa: E402
import store  # noqa: E402
from subjects import (  # noqa: E402
    POSTGRES,
    SQLITE,
    Env,
    LockwardenPostgres,
    LockwardenRelaxed,
    LockwardenSQLite,
    make,
)

TOY = measures.Plan(
    batch_seconds=0.005,
    repeat=1,
    handoff_rounds=4,
    queue_depths=(1, 2),
    settle=(0.001, 0.002),
    throughput_seconds=0.2,
    processes=2,
    crowds={SQLITE: (3, 2), POSTGRES: (3, 1)},
    flat_levels=(0, 10),
    flat_ops=20,
    counted_pairs=2,
)


def test_every_measure_runs_on_sqlite(tmp_path: Path) -> None:
    env = Env(run="smoke", work_dir=str(tmp_path))
    results = store.run(env, TOY, ["lockwarden-sqlite", "sqlite-floor"])
    results["meta"]["quick"] = True
    table = report.markdown(results)

    assert results["uncontended"]["sqlite-floor"]["pair_us"] > 0
    assert "floor: 2 write transactions" in table
    if LockwardenSQLite.missing() is not None:  # the store is not merged yet
        assert "lockwarden-sqlite" in results["skipped"]
        return
    assert not results["skipped"]
    assert results["uncontended"]["lockwarden-sqlite"]["pair_us"] > 0
    assert results["handoff"]["lockwarden-sqlite"]["median_ms"] > 0
    assert results["queued_handoff"]["lockwarden-sqlite"]["2"]["median_ms"] > 0
    assert results["queued_handoff"]["lockwarden-sqlite"]["ratio"] > 0
    assert results["throughput"]["lockwarden-sqlite"]["exclusive"] is True
    assert results["throughput"]["lockwarden-sqlite"]["attempts_per_acquisition"] >= 1
    crowd = results["crowd"]["lockwarden-sqlite"]
    assert (crowd["processes"], crowd["names"], crowd["exclusive"]) == (3, 2, True)
    assert crowd["per_second"] > 0 and crowd["p99_wait_ms"] >= crowd["median_wait_ms"] > 0
    assert "**Many processes**" in table
    for holder in ("other", "same"):
        assert results["flatness"]["lockwarden-sqlite"][holder]["10"]["ratio"] > 0
    assert "**lockwarden**" in table


def test_lockwarden_statement_counter_is_read(tmp_path: Path) -> None:
    """The round-trip measure reads the store's own counter beside the wire count."""
    if LockwardenSQLite.missing() is not None:
        pytest.skip("the store is not merged yet")
    subject = make("lockwarden-sqlite", Env(run="smoke", work_dir=str(tmp_path)))
    subject.setup()
    try:
        before = subject.counters()["statements"]
        subject.acquire("x")
        subject.release()
        assert subject.counters()["statements"] > before
    finally:
        subject.teardown()


@pytest.mark.slow
def test_the_etcd_subjects_run_on_a_private_cluster(tmp_path: Path) -> None:
    """The run starts its own etcd cluster for the etcd subjects and stops it afterwards."""
    if shutil.which("etcd") is None:
        pytest.skip("the etcd program is not installed")
    keys = ["lockwarden-etcd", "etcd-floor", "etcdctl-lock"]
    with store.run_env(keys) as env:
        assert env.etcd
        results = store.run(env, TOY, keys)
    assert not results["skipped"], results["skipped"]
    for key in keys:
        assert results["uncontended"][key]["pair_us"] > 0
    for key in ("lockwarden-etcd", "etcdctl-lock"):
        assert results["throughput"][key]["exclusive"] is True


def test_the_durable_handoff_floor_is_a_lock_granted_in_queue_order() -> None:
    """The floor the PostgreSQL hand-off is judged by must be a lock: exclusive, and fair
    under contention (each process served in turn), or its figures would flatter it."""
    with store.run_env(["pg-handoff-floor"]) as env:
        results = store.run(env, TOY, ["pg-handoff-floor"])
    assert not results["skipped"], results["skipped"]
    assert results["handoff"]["pg-handoff-floor"]["median_ms"] > 0
    contended = results["throughput"]["pg-handoff-floor"]
    assert contended["exclusive"] is True, contended
    # FIFO alternates the two processes; one descheduled for part of the toy run's 1 s
    # (seen under CI's load on 2 CPUs: 57 % against 43 %) loses its turns meanwhile. The
    # bound still fails a lock that serves one process most of the time.
    assert max(contended["shares"]) - min(contended["shares"]) <= 0.3, contended
    crowded = results["crowd"]["pg-handoff-floor"]  # beside lockwarden's many processes
    assert (crowded["processes"], crowded["exclusive"]) == (3, True), crowded
    results["meta"]["quick"] = True
    many = report.markdown(results).split("**Many processes**")[1].split("\n\n**")[0]
    assert "| floor: durable grant on release | 3 | 1 |" in many, many


def test_every_measure_runs_on_postgresql(tmp_path: Path) -> None:
    """Among them the one that applies to PostgreSQL alone: contended throughput beside idle
    processes whose stores have waited once."""
    if LockwardenPostgres.missing() is not None:
        pytest.skip("psycopg is not installed")
    env = Env(run=f"smoke{secrets.token_hex(4)}", work_dir=str(tmp_path))
    plan = dataclasses.replace(
        TOY, crowds={POSTGRES: (3, 1)}, idle_neighbours=2, neighbours_quiet=0.2
    )
    try:
        results = store.run(env, plan, ["lockwarden-pg"])
    finally:
        store.clean_servers(env)
    results["meta"]["quick"] = True
    assert not results["skipped"]
    assert results["throughput"]["lockwarden-pg"]["exclusive"] is True
    found = results["neighbours"]["lockwarden-pg"]
    assert (found["processes"], found["idle"], found["exclusive"]) == (2, 2, True)
    assert found["per_second"] > 0
    assert "**Idle neighbours**" in report.markdown(results)
    assert not measures.applies("neighbours", LockwardenRelaxed)
