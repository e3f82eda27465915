"""Benchmarks of the shared lock store beside its peers and the physical floors.

    python bench/store.py [--quick] [--only KEY,KEY...] [--write-results]

One run measures every subject (`subjects.SUBJECTS`) that can run here, with
every measure that applies to it (`measures`), and writes store.json,
store.md and store.png to bench/results/latest.tmp/ (not tracked). Only with
``--write-results`` does a full run write them to bench/results/ and put the
table into bench/README.md: the record figures, taken on a quiet machine.
Every ratio compares two things measured in the same run, on the same
machine. A quick run (a smoke test, figures meaningless) writes to
bench/results/quick/.

If `lockwarden.connect` is not importable (the store not merged yet), the
peers and floors run alone. To measure a store checkout elsewhere:
``PYTHONPATH=/path/to/store/src python bench/store.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import measures
import report
from subjects import BY_KEY, ETCD, MYSQL, POSTGRES, REDIS, SUBJECTS, Env, Subject, make

HERE = Path(__file__).parent
RESULTS = HERE / "results"
README = HERE / "README.md"
MARKERS = ("<!-- store results: written by bench/store.py -->", "<!-- end of store results -->")
PEERS = (
    "psycopg",
    "tooz",
    "psycopg2-binary",
    "mysqlclient",
    "PyMySQL",
    "redis",
    "python-redis-lock",
    "filelock",
    "fasteners",
    "etcd3gw",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes")
    parser.add_argument("--only", help="comma-separated subject keys: " + ", ".join(BY_KEY))
    parser.add_argument(
        "--write-results",
        action="store_true",
        help="write bench/results/ and bench/README.md (a full run on a quiet machine)",
    )
    args = parser.parse_args()
    plan = measures.QUICK if args.quick else measures.Plan()
    keys = args.only.split(",") if args.only else list(BY_KEY)
    if unknown := set(keys) - set(BY_KEY):
        parser.error(f"unknown subjects {sorted(unknown)}: choose from {', '.join(BY_KEY)}")

    with run_env(keys) as env:
        results = run(env, plan, keys)
    results["meta"]["quick"] = args.quick

    record = args.write_results and not args.quick
    out = RESULTS if record else RESULTS / ("quick" if args.quick else "latest.tmp")
    out.mkdir(parents=True, exist_ok=True)
    (out / "store.json").write_text(json.dumps(results, indent=2) + "\n")
    table = report.markdown(results)
    (out / "store.md").write_text(table)
    report.plot(results, out / "store.png")
    if record and not args.only:
        update_readme(table)
    print(table)
    print(f"wrote {out}/store.json, store.md, store.png")


@contextlib.contextmanager
def run_env(keys: list[str]) -> Iterator[Env]:
    """A fresh run: its own PostgreSQL schema, Redis keys and files, and (if an etcd subject
    is chosen and the `etcd` program is installed) a private etcd cluster; all removed
    afterwards."""
    RESULTS.mkdir(exist_ok=True)
    # Not /tmp: it may be tmpfs, where an fsync costs nothing. *.tmp is git-ignored.
    work = tempfile.mkdtemp(prefix="store-", suffix=".tmp", dir=RESULTS)
    env = Env(run=secrets.token_hex(4), work_dir=work)
    cluster = None
    if shutil.which("etcd") and any(BY_KEY[k].backend == ETCD for k in keys):
        sys.path.insert(0, str(HERE.parent))  # the chaos harness's cluster helper
        from chaos.etcd_cluster import EtcdCluster  # noqa: PLC0415

        cluster = EtcdCluster(Path(work) / "etcd")
        env = dataclasses.replace(env, etcd=cluster.endpoints)
    try:
        yield env
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
        clean_servers(env)


def clean_servers(env: Env) -> None:
    """Drop the run's schemas and delete its Redis keys; say so if that fails."""
    schemas = [env.schema, *(env.variant(v).schema for v in measures.VARIANTS)]
    try:
        import psycopg  # noqa: PLC0415

        with psycopg.connect(env.pg_url(), autocommit=True, connect_timeout=5) as conn:
            for schema in schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    except ImportError:
        pass  # no PostgreSQL subject ran
    except Exception as exc:
        print(f"could not drop the schemas {schemas}: {exc}", file=sys.stderr)
    databases = [env.database, *(env.variant(v).database for v in measures.VARIANTS)]
    try:
        with contextlib.closing(env.mysql_connect(database=False)) as conn:
            for database in databases:
                conn.cursor().execute(f"DROP DATABASE IF EXISTS {database}")
    except ImportError:
        pass  # no MariaDB subject ran
    except Exception as exc:
        print(f"could not drop the databases {databases}: {exc}", file=sys.stderr)
    try:
        import redis  # noqa: PLC0415

        client = redis.Redis.from_url(env.redis_url, socket_connect_timeout=3)
        for key in client.scan_iter(f"*lw-bench:{env.run}:*"):
            client.delete(key)
    except ImportError:
        pass  # no Redis subject ran
    except Exception as exc:
        print(f"could not delete the Redis keys lw-bench:{env.run}:*: {exc}", file=sys.stderr)


def run(env: Env, plan: measures.Plan, keys: list[str]) -> dict[str, Any]:
    """Every measure over every subject of ``keys`` that can run here: the results."""
    chosen = [cls for cls in SUBJECTS if cls.key in keys]
    backends = {cls.backend for cls in chosen}
    servers = probe(env, backends)
    skipped: dict[str, str] = {}
    subjects: list[Subject] = []
    for cls in chosen:
        reason = cls.missing() or servers.get(cls.backend)
        if reason is None:
            subject = make(cls.key, env)
            try:
                subject.setup()
            except Exception as exc:
                reason = f"setup failed: {type(exc).__name__}: {exc}"
            else:
                subjects.append(subject)
        if reason is not None:
            skipped[cls.key] = reason
            print(f"skipping {cls.key}: {reason}", file=sys.stderr)

    results: dict[str, Any] = {
        "meta": meta(env, plan, backends - set(servers)),
        "subjects": {
            cls.key: {
                "label": cls.label,
                "backend": cls.backend,
                "config": cls.config,
                "floor": cls.is_floor,
            }
            for cls in chosen
        },
        "skipped": skipped,
    }
    try:
        step("uncontended acquire + release")
        results["uncontended"] = measures.uncontended(subjects, plan)
        observed = [s for s in subjects if s.key == "lockwarden-sqlite"]
        if observed:
            step("observer cost")
            results["observer_cost"] = measures.observer_cost(observed[0], plan)
    finally:
        for subject in subjects:
            subject.teardown()
    measured = [s.key for s in subjects]
    pg = [k for k in measured if measures.applies("round_trips", BY_KEY[k])]
    if pg:
        step("round trips")
        results["round_trips"] = measures.round_trips(pg, env, plan)
    for measure in ("handoff", "queued_handoff", "throughput", "crowd", "neighbours", "flatness"):
        results[measure] = {}
        for key in measured:
            if measures.applies(measure, BY_KEY[key]):
                step(f"{measure}: {key}")
                try:
                    results[measure][key] = getattr(measures, measure)(key, env, plan)
                except RuntimeError as exc:
                    results[measure][key] = {"error": str(exc).splitlines()[0]}
                    print(exc, file=sys.stderr)
    results["meta"]["load_after"] = os.getloadavg()
    results["breakdown"] = report.breakdown(results)
    results["targets"] = report.targets(results)
    return results


def probe(env: Env, backends: set[str]) -> dict[str, str]:
    """Why each of the server-backed ``backends`` cannot be used, if it cannot."""
    down: dict[str, str] = {}
    if POSTGRES in backends:
        try:
            import psycopg  # noqa: PLC0415

            psycopg.connect(env.pg_url(), connect_timeout=3).close()
        except Exception as exc:
            down[POSTGRES] = f"PostgreSQL not reachable: {exc}".splitlines()[0]
    if MYSQL in backends:
        try:
            env.mysql_connect(database=False).close()
        except Exception as exc:
            down[MYSQL] = f"MariaDB not reachable: {exc}".splitlines()[0]
    if REDIS in backends:
        try:
            import redis  # noqa: PLC0415

            redis.Redis.from_url(env.redis_url, socket_connect_timeout=3).ping()
        except Exception as exc:
            down[REDIS] = f"Redis not reachable: {exc}".splitlines()[0]
    if ETCD in backends and not env.etcd:
        down[ETCD] = "the etcd program is not installed (Debian: apt-get install etcd-server)"
    return down


def meta(env: Env, plan: measures.Plan, up: set[str]) -> dict[str, Any]:
    found: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "plan": dataclasses.asdict(plan),
        "lockwarden": lockwarden_version(),
        "postgres": "-",
        "synchronous_commit": "-",
        "redis": "-",
        "versions": {},
    }
    for package in PEERS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found["versions"][package] = importlib.metadata.version(package)
    if POSTGRES in up:
        import psycopg  # noqa: PLC0415

        with psycopg.connect(env.pg_url()) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'), current_setting('synchronous_commit')"
            ).fetchone()
        assert row is not None
        found["postgres"] = f"PostgreSQL {row[0].split()[0]}"
        found["synchronous_commit"] = row[1]
    if REDIS in up:
        import redis  # noqa: PLC0415

        found["redis"] = redis.Redis.from_url(env.redis_url).info("server")["redis_version"]
    return found


def lockwarden_version() -> str:
    """Which lockwarden was measured: where it was imported from, and its git commit."""
    try:
        import lockwarden  # noqa: PLC0415
        from lockwarden import connect  # noqa: F401, PLC0415
    except ImportError:
        return "store not importable"
    where = Path(lockwarden.__file__).parent

    def git(*args: str) -> str:
        command = ["git", "-C", str(where), *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit, dirty = git("log", "-1", "--format=%h"), git("status", "--porcelain", ".")
    except (OSError, subprocess.CalledProcessError):
        return str(where)
    return f"{commit}{' (with uncommitted changes)' if dirty else ''}"


def step(what: str) -> None:
    print(f"-- {what}", file=sys.stderr, flush=True)


def update_readme(table: str) -> None:
    text = README.read_text()
    start, end = text.index(MARKERS[0]), text.index(MARKERS[1])
    README.write_text(text[: start + len(MARKERS[0])] + "\n\n" + table + "\n" + text[end:])


if __name__ == "__main__":
    main()
