"""The measures of the store benchmark. Each runs over every subject it applies to.

- `uncontended`: acquire + release of one free lock, best of N batches, the
  subjects' batches interleaved so that all of them see the same machine.
- `observer_cost`: the same pair on lockwarden's SQLite store with no
  observer and with a `PrometheusObserver` subscribed, batches alternating;
  and what the check costs that every event makes when nobody listens.
- `round_trips`: PostgreSQL round trips per acquire and per release, counted
  on the wire (`pgwire`), and lockwarden's own statement counters.
- `handoff`: two processes pass a lock back and forth; the time from the
  holder's release call to the waiter's acquire returning.
- `queued_handoff`: the same time with 1 and with 16 waiters queued on the
  name (processes in a ring, each queueing again as soon as it released):
  a store that wakes every waiter of a name pays for the crowd.
- `throughput`: 4 processes on one lock for a fixed time, with each
  process's share, and (lockwarden) what one acquisition cost: statements
  (each one transaction), attempts and waits.
- `crowd`: many processes on a few names (lockwarden, durable, on SQLite
  and PostgreSQL): acquisitions per second, the longest waits and whether
  every process was served alike, for a store whose cost could grow with the
  number of waiters.
- `neighbours`: `throughput` on PostgreSQL beside idle processes of the
  same database whose stores have waited once (lockwarden, durable).
- `flatness`: lockwarden's acquire of a fresh name with 0 … 100,000 other
  locks held in its table.

Times across processes are ``time.perf_counter()``: CLOCK_MONOTONIC on
Linux, one clock for the whole machine.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing as mp
import os
import queue
import random
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from pgwire import Count, RoundTripCounter
from subjects import (
    BY_KEY,
    ETCD,
    POSTGRES,
    SQLITE,
    Env,
    Lockwarden,
    PostgresHandoffFloor,
    Subject,
    make,
)

perf = time.perf_counter


@dataclass(frozen=True)
class Plan:
    """How much of each measure a run does."""

    batch_seconds: float = 0.1
    """The length a timed batch aims at (its size is calibrated per subject)."""
    repeat: int = 15
    """Timed batches per figure; the best counts (noise only ever adds time). Many short
    batches rather than a few long ones: more chances to catch the machine quiet."""
    handoff_rounds: int = 300
    queue_depths: tuple[int, ...] = (1, 16)
    """Waiters queued behind the holder in `queued_handoff`."""
    settle: tuple[float, float] = (0.01, 0.03)
    """The holder waits this long (uniformly at random) after the waiter has said it is
    about to acquire, so the waiter is blocked by the time of the release; random, so that
    a release does not fall at the same point of a polling waiter's cycle every time."""
    throughput_seconds: float = 5.0
    processes: int = 4
    crowds: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {SQLITE: (64, 4), POSTGRES: (32, 1)}
    )
    """Per backend, the processes and the names they share in `crowd` (each process
    keeps to one name, the processes spread evenly over the names)."""
    idle_neighbours: int = 28
    """Processes of the database whose stores waited once and sit idle beside `throughput`'s
    (`neighbours`)."""
    neighbours_quiet: float = 12.0
    """Seconds the neighbours sit idle before the contenders start: longer than a PostgreSQL
    store keeps listening after its last wait (10 s)."""
    flat_levels: tuple[int, ...] = (0, 10_000, 100_000)
    flat_ops: int = 500
    """At most this many acquires per timed batch (fewer where each is slow)."""
    counted_pairs: int = 50


_WARM_AGAIN = 1.0
"""Seconds before the clock at which a contender that sat quiet warms up again."""


QUICK = Plan(
    batch_seconds=0.03,
    repeat=3,
    handoff_rounds=20,
    queue_depths=(1, 4),
    throughput_seconds=1.0,
    crowds={SQLITE: (4, 2), POSTGRES: (4, 1)},
    idle_neighbours=4,
    neighbours_quiet=0.5,
    flat_levels=(0, 1_000, 10_000),
    flat_ops=50,
    counted_pairs=10,
)


def _timed(subject: Subject, names: Sequence[str]) -> tuple[float, float, float]:
    """Acquire and release each of ``names`` in turn: seconds in all, in acquire, in release."""
    acquire, release = subject.acquire, subject.release
    in_acquire = in_release = 0.0
    for name in names:
        t0 = perf()
        acquire(name)
        t1 = perf()
        release()
        t2 = perf()
        in_acquire += t1 - t0
        in_release += t2 - t1
    return in_acquire + in_release, in_acquire, in_release


def _per_op(best: tuple[float, float, float], n: int) -> dict[str, float]:
    total, acq, rel = best
    return {"pair_us": total / n * 1e6, "acquire_us": acq / n * 1e6, "release_us": rel / n * 1e6}


# -- uncontended ----------------------------------------------------------------------------


def uncontended(subjects: Sequence[Subject], plan: Plan) -> dict[str, dict[str, float]]:
    """Best-of-N batches of acquire + release of one free lock, per subject."""
    names: dict[str, list[str]] = {}
    for subject in subjects:
        name = f"{subject.env.run}/uncontended"
        _timed(subject, [name] * 20)  # warm up (first calls prepare statements, compile...)
        once = _timed(subject, [name] * 20)[0] / 20  # then size the batches
        n = max(20, min(50_000, round(plan.batch_seconds / once)))
        names[subject.key] = [name] * n
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(plan.repeat):
        for subject in subjects:  # interleaved: every subject sees the same conditions
            gc.collect()
            result = _timed(subject, names[subject.key])
            if subject.key not in best or result[0] < best[subject.key][0]:
                best[subject.key] = result
    return {
        s.key: {**_per_op(best[s.key], len(names[s.key])), "batch": len(names[s.key])}
        for s in subjects
    }


def observer_cost(subject: Subject, plan: Plan) -> dict[str, float]:
    """What the hooks cost: ``subject``'s pair without and with an observer (best of N
    alternating batches), and one `hooks.active` check, the whole cost of an unobserved
    event (an acquire + release emits two)."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from lockwarden import hooks  # noqa: PLC0415  (bench/ runs before the store is known)
    from lockwarden.observe.prometheus import PrometheusObserver  # noqa: PLC0415

    name = f"{subject.env.run}/observed"
    observer = PrometheusObserver(CollectorRegistry())
    once = _timed(subject, [name] * 20)[0] / 20
    names = [name] * max(20, min(50_000, round(plan.batch_seconds / once)))
    without = with_ = float("inf")
    for _ in range(plan.repeat):
        gc.collect()
        without = min(without, _timed(subject, names)[0])
        stop = hooks.subscribe(observer)
        try:
            with_ = min(with_, _timed(subject, names)[0])
        finally:
            stop()
    checks = 100_000
    t0 = perf()
    for _ in range(checks):
        hooks.active()
    return {
        "without_us": without / len(names) * 1e6,
        "with_us": with_ / len(names) * 1e6,
        "check_ns": (perf() - t0) / checks * 1e9,
        "batch": len(names),
    }


# -- round trips ---------------------------------------------------------------------------


def round_trips(keys: Sequence[str], env: Env, plan: Plan) -> dict[str, dict[str, Any]]:
    """Round trips per acquire and per release on PostgreSQL, counted on the wire.

    Each subject gets fresh connections through `pgwire.RoundTripCounter`. The
    median per call is reported (a heartbeat landing inside one call cannot
    move it) with the mean beside it, and the median time the call's
    exchanges spent beyond the proxy: at the server, commit included.
    """
    results: dict[str, dict[str, Any]] = {}
    with RoundTripCounter(env.pg_host, env.pg_port) as counter:
        for key in keys:
            subject = make(key, env.via(counter.port))
            subject.setup()
            try:
                name = f"{env.run}/counted"
                _timed(subject, [name] * 10)  # past psycopg's one-off statement preparation
                own = subject.counters()
                per_acquire: list[Count] = []
                per_release: list[Count] = []
                for _ in range(plan.counted_pairs):
                    c0 = counter.count()
                    subject.acquire(name)
                    c1 = counter.count()
                    subject.release()
                    per_acquire.append(c1 - c0)
                    per_release.append(counter.count() - c1)
                own_after = subject.counters()
            finally:
                subject.teardown()
            result = {**_summarize("acquire", per_acquire), **_summarize("release", per_release)}
            if own:
                statements = own_after.get("statements", 0) - own.get("statements", 0)
                result["own_statements_per_pair"] = statements / plan.counted_pairs
            results[key] = result
    return results


def _summarize(call: str, counts: list[Count]) -> dict[str, float]:
    return {
        f"{call}_round_trips": statistics.median(c.round_trips for c in counts),
        f"{call}_round_trips_mean": statistics.fmean(c.round_trips for c in counts),
        f"{call}_connections": statistics.fmean(c.connections for c in counts),
        f"{call}_server_us": statistics.median(c.server_seconds for c in counts) * 1e6,
    }


# -- several processes on one lock ------------------------------------------------------------

Worker = Callable[..., Any]


@dataclass(frozen=True)
class _Job:
    """What every process of a `together` run gets."""

    worker: Worker
    key: str
    env: Env
    ready: Any  # Queue: each process puts its number once set up
    go: Any  # Event: set when all are
    start_at: Any  # Value: the common start time
    out: Any  # Queue: (number, result, error)


def _child(job: _Job, me: int, kwargs: dict[str, Any]) -> None:
    """A child process: set the subject up, run the worker on it, report what it returned."""

    def start() -> float:
        """Say this process is ready; return when every process is (the common start time)."""
        job.ready.put(me)
        job.go.wait()
        value: float = job.start_at.value
        return value

    try:
        subject = make(job.key, job.env)
        subject.setup()
        try:
            result = job.worker(subject, start, **kwargs)
        finally:
            subject.teardown()
        job.out.put((me, result, None))
    except BaseException as exc:
        job.out.put((me, None, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def together(
    key: str, env: Env, worker: Worker, kwargs: Sequence[dict[str, Any]], timeout: float
) -> list[Any]:
    """Run ``worker(subject, start, **kwargs[i])`` in one new process per ``kwargs[i]``.

    Each builds its own subject; they are started together once all of them
    have set up (the worker calls ``start()``). Returns their results in order;
    raises RuntimeError if one failed or they did not finish within ``timeout``.
    """
    ctx = mp.get_context("spawn")  # not fork: the parent has database threads and sockets
    job = _Job(worker, key, env, ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0), ctx.Queue())
    procs = [
        ctx.Process(target=_child, args=(job, me, kw), daemon=True) for me, kw in enumerate(kwargs)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, Any] = {}
    try:
        deadline = perf() + 60.0
        waiting = len(procs)
        while waiting:
            try:
                job.ready.get(timeout=0.5)
                waiting -= 1
            except queue.Empty:
                _check(job.out, procs, deadline, "set up")
        job.start_at.value = perf()
        job.go.set()
        deadline = perf() + timeout
        while len(results) < len(procs):
            me, result, error = _get(job.out, procs, deadline)
            if error is not None:
                raise RuntimeError(f"{key}, process {me}: {error}")
            results[me] = result
    finally:
        for proc in procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [results[me] for me in range(len(procs))]


def _get(out: Any, procs: list[Any], deadline: float) -> tuple[int, Any, str | None]:
    while True:
        try:
            message: tuple[int, Any, str | None] = out.get(timeout=0.5)
            return message
        except queue.Empty:
            _check(out, procs, deadline, "finish")


def _check(out: Any, procs: list[Any], deadline: float, what: str) -> None:
    """Between waits: fail if time is up or a process died without a word."""
    if not out.empty():
        me, _, error = out.get()
        raise RuntimeError(f"process {me}: {error}")
    if perf() > deadline:
        raise RuntimeError(f"the processes did not {what} in time")
    for proc in procs:
        if proc.exitcode not in (None, 0):
            raise RuntimeError(f"a process exited with {proc.exitcode}")


# -- handoff ---------------------------------------------------------------------------------


def handoff(key: str, env: Env, plan: Plan) -> dict[str, float]:
    """Median and p99 of release → the waiter holding it, between two processes."""
    a, b = mp.get_context("spawn").Pipe()
    rounds, name = plan.handoff_rounds, f"{env.run}/handoff"
    times = together(
        key,
        env,
        _handoff_player,
        [
            {"me": me, "peer": peer, "rounds": rounds, "name": name, "settle": plan.settle}
            for me, peer in enumerate((a, b))
        ],
        timeout=rounds * (plan.settle[1] + 1.0) + 30.0,
    )
    # Round i: player i % 2 released at times[i % 2][i], the other held at times[1 - i % 2][i].
    latency = sorted(times[1 - i % 2][i] - times[i % 2][i] for i in range(rounds))
    return {
        "median_ms": statistics.median(latency) * 1e3,
        "p99_ms": latency[min(rounds - 1, round(0.99 * (rounds - 1)))] * 1e3,
        "max_ms": latency[-1] * 1e3,
        "rounds": rounds,
    }


def _handoff_player(
    subject: Subject,
    start: Callable[[], float],
    *,
    me: int,
    peer: Connection,
    rounds: int,
    name: str,
    settle: tuple[float, float],
) -> list[float]:
    """One of two players; in round i player i % 2 holds the lock and the other waits.

    The waiter tells the holder it is about to acquire; the holder lets it
    block (`Plan.settle`), notes the time and releases; the waiter notes the
    time it holds the lock and says so, and only then does the former holder
    queue up for the next round (so nobody barges in on a polling waiter).
    """
    rng = random.Random(me)
    if me == 0:
        subject.acquire(name)
    start()
    times: list[float] = []
    for i in range(rounds):
        if i % 2 == me:
            assert peer.recv() == "waiting"
            time.sleep(rng.uniform(*settle))
            times.append(perf())
            subject.release()
            assert peer.recv() == "got"
        else:
            peer.send("waiting")
            subject.acquire(name)
            times.append(perf())
            peer.send("got")
    if rounds % 2 == me:  # the last round's waiter holds the lock
        subject.release()
    return times


# -- handoff with a queue -----------------------------------------------------------------


def queued_handoff(key: str, env: Env, plan: Plan) -> dict[str, Any]:
    """Release → the next holder, with ``plan.queue_depths`` waiters queued; and their ratio."""
    found: dict[str, Any] = {}
    for depth in plan.queue_depths:
        found[str(depth)] = _ring(key, env, plan, depth)
    first, last = (found[str(d)].get("median_ms") for d in (plan.queue_depths[0], depth))
    if first and last:
        found["ratio"] = last / first
    return found


def _ring(key: str, env: Env, plan: Plan, waiters: int) -> dict[str, float]:
    rounds, name = plan.handoff_rounds, f"{env.run}/queued/{waiters}"
    counter = mp.get_context("spawn").Value("q", 0, lock=False)
    spans: list[list[tuple[float, float]]] = together(
        key,
        env,
        _ring_player,
        [{"name": name, "rounds": rounds, "counter": counter, "settle": plan.settle}]
        * (waiters + 1),
        timeout=rounds * (plan.settle[1] + 1.0) + 60.0,
    )
    # The holds, in the order they were granted: each gap is one hand-off.
    holds = sorted(span for player in spans for span in player)
    latency = sorted(nxt[0] - prev[1] for prev, nxt in itertools.pairwise(holds))
    return {
        "median_ms": statistics.median(latency) * 1e3,
        "p99_ms": latency[min(len(latency) - 1, round(0.99 * (len(latency) - 1)))] * 1e3,
        "handoffs": len(latency),
        "waiters": waiters,
    }


def _ring_player(
    subject: Subject,
    start: Callable[[], float],
    *,
    name: str,
    rounds: int,
    counter: Any,
    settle: tuple[float, float],
) -> list[tuple[float, float]]:
    """Hold for a moment (while everyone else queues), release, queue again; ``rounds`` holds
    in all. Returns (held at, released at) of each hold."""
    rng = random.Random()
    start()
    holds: list[tuple[float, float]] = []
    while True:
        subject.acquire(name)
        held_at = perf()
        counter.value += 1  # inside the lock: exclusive
        if counter.value > rounds:
            subject.release()
            return holds
        time.sleep(rng.uniform(*settle))
        released_at = perf()
        subject.release()
        holds.append((held_at, released_at))


# -- throughput -----------------------------------------------------------------------------


def throughput(key: str, env: Env, plan: Plan) -> dict[str, Any]:
    """Acquisitions per second of ``plan.processes`` processes looping on one lock.

    The critical section increments a counter in shared memory without any
    lock of its own: if the subject's lock did not exclude, increments would
    be lost, and ``exclusive`` says whether they all arrived.
    """
    return _contended(key, env, plan, idle=0, quiet=0.0)


def _contended(key: str, env: Env, plan: Plan, *, idle: int, quiet: float) -> dict[str, Any]:
    """`throughput`, beside ``idle`` processes that sit idle (`_contended_process`), the loops
    starting ``quiet`` seconds after every process is set up."""
    counter = mp.get_context("spawn").Value("q", 0, lock=False)
    common = {
        "name": f"{env.run}/contended/{idle}",
        "seconds": plan.throughput_seconds,
        "counter": counter,
        "quiet": quiet,
    }
    ran: list[tuple[int, dict[str, int], list[float]]] = [
        found
        for found in together(
            key,
            env,
            _contended_process,
            [{**common, "idle": False}] * plan.processes + [{**common, "idle": True}] * idle,
            timeout=quiet + plan.throughput_seconds + 120.0,
        )
        if found is not None
    ]
    counts = [done for done, _, _ in ran]
    total = sum(counts)
    found: dict[str, Any] = {
        "per_second": total / plan.throughput_seconds,
        "shares": [c / total for c in counts] if total else [],
        # each process made one more increment, for the acquire that ended its loop
        "exclusive": counter.value == total + plan.processes,
        "processes": plan.processes,
        "seconds": plan.throughput_seconds,
    }
    acquisitions = total + plan.processes
    for counter_name in ran[0][1]:  # per acquisition (and its release)
        found[f"{counter_name}_per_acquisition"] = (
            sum(c[counter_name] for _, c, _ in ran) / acquisitions
        )
    return found


def _throughput_worker(
    subject: Subject,
    start: Callable[[], float],
    *,
    name: str,
    seconds: float,
    counter: Any,
    quiet: float = 0.0,
) -> tuple[int, dict[str, int], list[float]]:
    """Loop on the lock until the time is up, from ``quiet`` seconds after every process
    is set up: how many acquisitions, what they cost by the subject's own counters, and
    how long each acquire waited (seconds).

    First `Subject.warm_up`, before the clock starts: what the first use of a
    connection costs (the server's first run of the lock functions, prepared
    statements) and what the first wait sets up (lockwarden's wake-ups: a LISTEN
    connection) is paid once per process, and would count more the more processes
    share the few seconds measured. After a quiet time, again just before the clock
    (lockwarden stops its wake-ups after 10 s without a waiter).
    """
    warm = f"{name}/warm/{os.getpid()}"
    subject.warm_up(warm)
    begin = start() + quiet
    if quiet:
        time.sleep(max(0.0, begin - _WARM_AGAIN - perf()))
        subject.warm_up(warm)
        time.sleep(max(0.0, begin - perf()))
    deadline = begin + seconds
    before = subject.counters()
    done = 0
    waits: list[float] = []
    while True:
        asked_at = perf()
        subject.acquire(name)
        held_at = perf()
        counter.value += 1  # the critical section
        subject.release()
        if held_at >= deadline:
            after = subject.counters()
            return done, {k: after[k] - before[k] for k in before}, waits
        waits.append(held_at - asked_at)
        done += 1


# -- crowd ----------------------------------------------------------------------------------


def crowd(key: str, env: Env, plan: Plan) -> dict[str, Any]:
    """`throughput` with many processes on a few names (`Plan.crowds`).

    Each name has its own unlocked counter, as in `throughput`; ``fair`` is
    the fewest acquisitions any process made over the most (FIFO serves
    every waiter of a name in turn, so near 1).
    """
    processes, names = plan.crowds[BY_KEY[key].backend]
    ctx = mp.get_context("spawn")
    counters = [ctx.Value("q", 0, lock=False) for _ in range(names)]
    ran: list[tuple[int, dict[str, int], list[float]]] = together(
        key,
        env,
        _throughput_worker,
        [
            {
                "name": f"{env.run}/crowd/{i % names}",
                "seconds": plan.throughput_seconds,
                "counter": counters[i % names],
            }
            for i in range(processes)
        ],
        timeout=plan.throughput_seconds + 300.0,
    )
    counts = [done for done, _, _ in ran]
    total = sum(counts)
    waits = sorted(w for _, _, each in ran for w in each)
    return {
        "processes": processes,
        "names": names,
        "per_second": total / plan.throughput_seconds,
        "median_wait_ms": statistics.median(waits) * 1e3 if waits else None,
        "p99_wait_ms": waits[int(len(waits) * 0.99)] * 1e3 if waits else None,
        "max_wait_ms": waits[-1] * 1e3 if waits else None,
        "fair": min(counts) / max(counts) if max(counts) else None,
        "exclusive": sum(c.value for c in counters) == total + processes,
    }


# -- idle neighbours ---------------------------------------------------------------------------


def neighbours(key: str, env: Env, plan: Plan) -> dict[str, Any]:
    """`throughput` beside ``plan.idle_neighbours`` idle processes of the same database,
    each of whose stores has waited once.

    PostgreSQL signals every connection of the database that LISTENs, on any
    channel, at each commit that notifies, and each wakes to read the queue: a
    store that kept listening after its waiters were gone would cost every grant
    in the database, whoever made it. Compare ``per_second`` with `throughput`'s.
    """
    return {
        **_contended(key, env, plan, idle=plan.idle_neighbours, quiet=plan.neighbours_quiet),
        "idle": plan.idle_neighbours,
    }


def _contended_process(
    subject: Subject,
    start: Callable[[], float],
    *,
    name: str,
    seconds: float,
    counter: Any,
    quiet: float,
    idle: bool,
) -> tuple[int, dict[str, int], list[float]] | None:
    """A contender: `_throughput_worker` once every process has been set up for ``quiet``
    seconds. A neighbour (``idle``): its store waits once (for a lock another of its
    sessions holds), then it sits idle until the contenders are done."""
    if not idle:
        return _throughput_worker(
            subject, start, name=name, seconds=seconds, counter=counter, quiet=quiet
        )
    assert isinstance(subject, Lockwarden)  # only lockwarden subjects run this measure
    subject.wait_once(f"{name}/gate/{os.getpid()}")
    begin = start()
    time.sleep(max(0.0, begin + quiet + seconds + 1.0 - perf()))
    return None


# -- flatness ------------------------------------------------------------------------------------


HOLDERS = ("other", "same")
VARIANTS = (*HOLDERS, "empty")
"""The flatness measure's store locations (`Env.variant`): one table filled per kind of
holder, and an empty one."""


def flatness(key: str, env: Env, plan: Plan) -> dict[str, Any]:
    """Acquire (and release) of never-used names with more and more other locks held.

    Twice, each on a table of its own: with the other locks held by another
    session ("other"), and by the measuring session itself ("same"), as a
    process holding many locks would. The same subject on an empty table is
    timed in alternate batches, so ``ratio`` (acquire with the others held
    over acquire on the empty table) compares two things measured side by
    side, however the machine's load drifts while the table fills. The other
    measures never see these tables.
    """
    control = make(key, env.variant("empty"))
    control.setup()
    try:
        found: dict[str, Any] = {}
        for holder in HOLDERS:
            subject = make(key, env.variant(holder))
            assert isinstance(subject, Lockwarden)
            subject.setup()
            try:
                found[holder] = _levels(subject, control, holder, plan)
            finally:
                subject.teardown()
        return found
    finally:
        control.teardown()


def _levels(subject: Lockwarden, control: Subject, holder: str, plan: Plan) -> dict[str, Any]:
    levels: dict[str, Any] = {}
    for level in plan.flat_levels:
        t0 = perf()
        subject.fill(level, same_session=holder == "same")
        filled_in = perf() - t0
        prefix = f"fresh/{holder}/{level}"
        for s in (subject, control):
            _timed(s, [f"{prefix}/warm/{i}" for i in range(5)])
        once = _timed(subject, [f"{prefix}/size/{i}" for i in range(5)])[0] / 5
        n = max(20, min(plan.flat_ops, round(plan.batch_seconds / once)))
        best: dict[str, tuple[float, float, float]] = {}
        for r in range(plan.repeat):
            for which, s in (("filled", subject), ("empty", control)):
                result = _timed(s, [f"{prefix}/{r}/{i}" for i in range(n)])
                if which not in best or result[1] < best[which][1]:
                    best[which] = result
        filled, empty = _per_op(best["filled"], n), _per_op(best["empty"], n)
        levels[str(level)] = {
            **filled,
            "empty_acquire_us": empty["acquire_us"],
            "empty_release_us": empty["release_us"],
            "ratio": filled["acquire_us"] / empty["acquire_us"],
            "batch": n,
            "fill_seconds": filled_in,
        }
    return levels


def applies(measure: str, subject: type[Subject]) -> bool:
    """Whether ``measure`` runs over ``subject``."""
    if measure in ("handoff", "queued_handoff", "throughput"):
        return subject.is_lock
    if measure == "round_trips":
        return subject.backend == POSTGRES
    if measure == "crowd":  # and on PostgreSQL the floor that bounds it, beside it
        durable = issubclass(subject, Lockwarden) and subject.durability == "durable"
        return (
            durable and subject.backend in (SQLITE, POSTGRES)
        ) or subject is PostgresHandoffFloor
    if measure == "neighbours":  # PostgreSQL's NOTIFY alone signals every listener
        durable = issubclass(subject, Lockwarden) and subject.durability == "durable"
        return durable and subject.backend == POSTGRES
    if measure == "flatness":  # one per table: the relaxed subject shares the durable one's
        # (not on etcd: an acquire there reads only its own name's keys, and filling
        # the store with 100,000 locks would take most of a run)
        durable = issubclass(subject, Lockwarden) and subject.durability == "durable"
        return durable and subject.backend != ETCD
    return True
