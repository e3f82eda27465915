"""Uncontended acquire+release on the shared store, with PostgreSQL's floors beside it.

    python bench/store_uncontended.py [--pg URL] [--sqlite PATH] [-n N]

Prints microseconds per acquire+release pair (median of 5 runs of N pairs)
and the round trips (statements) per acquire and per release. The peer
comparison (tooz, redis, filelock, ...) is a separate benchmark; this one
only drives the store through its public API and its ``stats`` counters.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

import lockwarden


def per_op(run: Callable[[int], None], n: int) -> float:
    """Median microseconds per call of a batch of ``n``."""
    run(max(n // 10, 10))  # warm up: connections, prepared statements
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        run(n)
        samples.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(samples)


def store_pair(url: str, n: int, **options: object) -> tuple[float, float, float]:
    store = lockwarden.connect(url, **options)  # type: ignore[arg-type]
    try:
        with store.session(app_id="bench") as s:

            def run(count: int) -> None:
                for _ in range(count):
                    s.lock("bench", timeout=0).release()

            micros = per_op(run, n)
            before = store.stats["statements"]
            lock = s.lock("bench", timeout=0)
            acquire = store.stats["statements"] - before
            before = store.stats["statements"]
            lock.release()
            release = store.stats["statements"] - before
            return micros, acquire, release
    finally:
        store.close()


def pg_floors(dsn: str, n: int) -> dict[str, float]:
    """What one connection pays for two statements of the kinds a lock pair could be."""
    with psycopg.connect(dsn, autocommit=True) as conn:

        def repeat(*statements: str) -> Callable[[int], None]:
            def run(count: int) -> None:
                for _ in range(count):
                    for statement in statements:
                        conn.execute(statement)

            return run

        update = "UPDATE {} SET v = v + 1 WHERE id = 1"
        conn.execute("CREATE TEMP TABLE floor_temp (id int PRIMARY KEY, v int)")  # no WAL
        conn.execute("CREATE TABLE public.lw_bench_floor (id int PRIMARY KEY, v int)")
        try:
            for table in ("floor_temp", "public.lw_bench_floor"):
                conn.execute(f"INSERT INTO {table} VALUES (1, 0)")
            return {
                "two durable single-row write transactions": per_op(
                    repeat(*[update.format("public.lw_bench_floor")] * 2), n
                ),
                "two unlogged (temp table) write transactions": per_op(
                    repeat(*[update.format("floor_temp")] * 2), n
                ),
                "pg_advisory_lock + unlock": per_op(
                    repeat("SELECT pg_advisory_lock(42)", "SELECT pg_advisory_unlock(42)"), n
                ),
            }
        finally:
            conn.execute("DROP TABLE public.lw_bench_floor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--sqlite", default=None, help="SQLite file (default: a temporary one)")
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()

    schema = f"lw_bench_{secrets.token_hex(3)}"
    rows: list[tuple[str, float, str]] = []
    try:
        for label, options in (("durable", {}), ("relaxed", {"durability": "relaxed"})):
            micros, acq, rel = store_pair(f"{args.pg}?schema={schema}", args.n, **options)
            rows.append((f"lockwarden PostgreSQL ({label})", micros, f"{acq:g} + {rel:g}"))
    finally:
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    rows += [(name, micros, "2") for name, micros in pg_floors(args.pg, args.n).items()]
    with tempfile.TemporaryDirectory() as tmp:
        path = args.sqlite or str(Path(tmp) / "bench.db")
        micros, acq, rel = store_pair(f"sqlite:///{path}", max(args.n // 4, 100))
        rows.append(("lockwarden SQLite (WAL, synchronous=FULL)", micros, f"{acq:g} + {rel:g}"))

    print(f"{'what':<48} {'us per pair':>12}  statements (acquire + release)")
    for name, micros, statements in rows:
        print(f"{name:<48} {micros:>12.0f}  {statements}")


if __name__ == "__main__":
    main()
