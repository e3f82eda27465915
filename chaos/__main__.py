"""``python -m chaos``: one run of the harness, then its check.

Exit status 0 if the run was valid and no safety violation was found.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from chaos.check import check_file, report
from chaos.config import Config
from chaos.etcd_cluster import EtcdCluster
from chaos.network import WorkerLinks, endpoints
from chaos.run import MYSQL_DEFAULT, PG_DEFAULT, drop, run, store_url


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Run lock workers against a store under injected faults, then check them.",
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres", "etcd", "mysql"), required=True)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--names", type=int, default=4, help="lock names (and registers)")
    parser.add_argument("--ttl", type=float, default=2.0, help="the workers' session TTL")
    parser.add_argument("--fault-every", type=float, default=3.0, help="mean seconds")
    parser.add_argument(
        "--hold", type=float, default=0.25, help="longest sleep while holding, in TTLs"
    )
    parser.add_argument(
        "--think", type=float, default=0.05, help="longest pause between operations, seconds"
    )
    parser.add_argument(
        "--no-fencing", action="store_true", help="control run: registers without tokens"
    )
    parser.add_argument(
        "--no-local-deadline",
        action="store_true",
        help="control run: the workers switch the library's local lease deadline off",
    )
    parser.add_argument(
        "--no-partitions",
        action="store_true",
        help="the workers connect straight, not through proxies: no partitions",
    )
    parser.add_argument(
        "--allow-restart", action="store_true", help="the nemesis may restart PostgreSQL"
    )
    parser.add_argument("--restart-every", type=float, default=300.0, help="at most one per")
    parser.add_argument(
        "--crash",
        action="store_true",
        help="restarts are crashes (immediate shutdown: the server recovers from its log)",
    )
    parser.add_argument(
        "--clock-steps",
        action="store_true",
        help="the nemesis also steps workers' wall clocks, 6 hours forward or back",
    )
    parser.add_argument(
        "--durability",
        choices=("durable", "relaxed"),
        default="durable",
        help="the workers' connect(durability=...); relaxed is PostgreSQL's and SQLite's",
    )
    parser.add_argument(
        "--dump-stalls",
        action="store_true",
        help="each worker dumps its threads' stacks to HISTORY.stalls/ when an acquire"
        " overruns its timeout by 1 s",
    )
    parser.add_argument("--pg", default=PG_DEFAULT, help="PostgreSQL URL (a schema is added)")
    parser.add_argument(
        "--mysql", default=MYSQL_DEFAULT, help="MySQL server URL (a database is added)"
    )
    parser.add_argument("--history", type=Path, required=True, help="JSON lines written here")
    parser.add_argument("--summary", type=Path, help="default: HISTORY.summary.json")
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL schema")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.names < 2 or args.workers < 1:
        parser.error("a run needs at least one worker and two names (multi-locks take two)")
    if args.hold < 0 or args.think < 0:
        parser.error("--hold and --think are sleeps: give 0 or more")
    if args.backend == "etcd" and (args.no_fencing or args.allow_restart):
        parser.error("--no-fencing and --allow-restart are for the SQL backends")
    if args.backend == "mysql" and args.no_fencing:
        parser.error(
            "the control run (--no-fencing) has plain registers on sqlite and postgres only"
        )
    if args.crash and not args.allow_restart:
        parser.error("--crash says how the server restarts: give --allow-restart too")
    if args.durability == "relaxed" and args.backend not in ("postgres", "sqlite"):
        parser.error("--durability relaxed is for PostgreSQL and SQLite only")
    if args.backend == "mysql" and args.allow_restart:
        parser.error("--allow-restart restarts PostgreSQL only (never the shared MariaDB)")
    partitions = args.backend != "sqlite" and not args.no_partitions
    if args.no_local_deadline and not partitions:
        parser.error(
            "the control run (--no-local-deadline) needs partitions: postgres, mysql or etcd"
        )

    args.history.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        run_id = f"{args.seed}_{secrets.token_hex(3)}"
        # On etcd, a private 3-member cluster whose members the nemesis kills, pauses and
        # (its peers talking through proxies) cuts off.
        members = (
            EtcdCluster(Path(tmp) / "etcd", peer_proxies=partitions)
            if args.backend == "etcd"
            else None
        )
        url = (
            members.url(f"chaos_{run_id}")
            if members is not None
            else store_url(args.backend, run_id, Path(tmp), args.pg, args.mysql)
        )
        # Each worker reaches the store through proxies of its own, which the nemesis freezes.
        network = None
        if partitions:
            try:
                network = WorkerLinks(endpoints(url), args.workers)
            except ValueError as exc:
                if members is not None:
                    members.stop()
                parser.error(f"{exc}; or run with --no-partitions")
        config = Config(
            backend=args.backend,
            url=url,
            run_id=run_id,
            seed=args.seed,
            duration=args.duration,
            history=str(args.history),
            board=str(Path(tmp) / "board"),
            workers=args.workers,
            names=args.names,
            ttl=args.ttl,
            fencing=not args.no_fencing,
            allow_restart=args.allow_restart,
            restart_every=args.restart_every,
            crash=args.crash,
            clock_steps=args.clock_steps,
            durability=args.durability,
            fault_every=args.fault_every,
            hold=args.hold,
            think=args.think,
            dump_stalls=args.dump_stalls,
            proxies=(
                None
                if network is None
                else [network.addresses(slot) for slot in range(args.workers)]
            ),
            local_deadline=not args.no_local_deadline,
        )
        try:
            run(config, args.history.with_suffix(".log"), members, network)
        finally:
            if not args.keep:
                drop(config)
            if members is not None:
                members.stop()
            if network is not None:
                network.close()
    summary = check_file(args.history, args.summary)
    print(report(summary))
    return 0 if summary["safe"] and summary["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
