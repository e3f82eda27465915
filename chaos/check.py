"""The checker: reads a history afterwards and says whether the locks were safe and live.

``python -m chaos.check HISTORY [--json PATH]`` prints a summary, writes it as
JSON (default ``HISTORY`` with the suffix ``.summary.json``), and exits 1 if
any safety violation was found (or the run is not valid: a worker crashed,
the end state is missing).

Operations follow Jepsen's semantics. An operation is invoked, then either
*ok* (it happened), *fail* (it certainly did not) or *info* (unknown: the
database may or may not have done it). An invocation without a completion —
the worker was killed — is an info. A check never assumes that an info
happened, and never that it did not: each is built to hold either way.

Times: each step has a window, from its invocation to its completion, and
took effect at some instant inside it. A violation is only reported when
no choice of those instants explains the history.

Safety (each must be 0):

- ``overlapping_accepted_writes`` — two accepted increments of one register
  whose critical sections surely overlapped: each read the register before
  the other's write was even sent (read completed before the other's write
  was invoked, both ways). One of the two increments was lost.
- ``token_order`` — an accepted write that certainly came after another
  accepted write of the same register (invoked after the other completed)
  but carries a token that is not larger.
- ``grant_order`` — the same for grants of a name: a grant that certainly
  came after another carries a token that is not larger (src/lockwarden/store/README.md).
- ``lost_increments`` — accepted increments missing from the register:
  two accepted writes wrote the same value, or the final value is smaller
  than the number of accepted writes. ``unexplained_increments``: it is
  larger than accepted plus unknown writes.
- ``read_write_exclusion`` — a read lock under which the register changed
  (its two reads differ), or whose read is not the state that the writes of
  older tokens left (it saw a newer holder's write, or missed an older one's,
  allowing for unknown writes).
- ``partial_multi_locks`` — a multi-lock granted without a token for each
  name, or refused but leaving some of its names held by the session once
  none of its releases was still being retried in the background (a
  refusal whose clean-up met an outage is undone by such a retry; the
  worker waits up to a TTL for them before it looks).
- ``refused_live_holders`` — the register turned a holder away, the store
  then confirmed that it still held the lock (``check``: rows never come
  back, so it held all along), yet a grant of the name with a newer token,
  in a conflicting mode, had completed before that check began: two
  holders at once. A refused holder that nobody had overtaken is counted
  apart, as ``false_refusals``: not unsafe, but an access it was entitled
  to was refused.
- ``holding_overlaps`` — two holds of one name, by different processes, in
  conflicting modes (two writers, or a writer and a reader), whose *holding
  intervals* overlap (see "Holding intervals" below): two workers acting
  under the lock at the same instant of the machine's monotonic clock.
- ``locks_after_clean``, ``waiters_after_clean`` — rows left after the run,
  once every worker was killed, a TTL passed (on etcd 2.5 s more: ``run.LEASE_LATE``)
  and ``Store.clean()`` ran.

Holding intervals: a worker that was granted a lock never holds it past its
own local deadline, and no two workers' holding intervals on one name
overlap. A hold's interval runs from the completion (ok) of its acquire to
the moment its worker stopped acting under the lock: the earliest of its
``stopped`` record (written before the release is invoked, at a refusal by
a register, at an error of unknown outcome, or when the worker saw that it
had been told of the loss), the ``lost`` record of its process (the
library's ``on_lost``: no access is invoked after it, `chaos.worker.Told`),
its release's invocation, and the end of its process (its retirement, the
record of the kill that ended it, or the end of the run) — but never before
the invocation of its last register access. A request already sent when
the worker stopped may still arrive later (a partition holds it): that is
the fences' to refuse, and the register checks above judge it. Times are
the records' ``time.monotonic()``, one clock for every process of the host.
Holds whose worker the nemesis paused (SIGSTOP) while it held the lock or
was being granted it are left out (``paused_left_out``): a ``pause`` record
of its pid at or before the interval's end, its ``resume`` at or after the
invocation of the acquire. A frozen process cannot stop itself, which is
what fencing is for; and a grant made to a frozen process (a release hands
it over while the waiter is stopped) is returned only as the process thaws,
possibly after its lease ran out and before the library has said so: its
first access is the fence's to refuse. Such grants, returned after their
session's local deadline, are counted whatever caused them
(``granted_past_deadline``). The local deadline of a hold is its session's lease end as the
worker recorded it (``deadline`` in its ``stopped`` or ``lost`` record,
from `Session.expires_at`). ``held_past_local_deadline`` (an observation,
not a violation) counts the holds whose interval ended more than
`LATE_TOLERANCE` after it: the library keeps a tenth of the TTL between the
local deadline and the first moment the database may pass the lock on, for
its timer thread and the program to act in; whether a late stop ever let
two holders overlap is what ``holding_overlaps`` decides, from the grants
actually made, and a verdict that hung on the host's scheduling delays would
say more about the load than about the locks. Those past the whole margin
are counted apart (``beyond_margin``).

Liveness (reported, not judged): for each write holder killed, paused or cut
off alone by a partition, the time from that moment to the next grant of a
name it held, to another process, counted when that request was made within
one TTL of the death (otherwise it measures an idle name, not a recovery). Readers are left out:
live readers sharing the name hold it up as well; each
PostgreSQL restart and the time to the next grant after it; the longest a
process went without recording anything. A recovery whose taker was itself
cut off by a partition meanwhile is not measured: it would measure that
partition.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.history import Record, load_history

EXAMPLES = 5
"""Examples of each violation kept in the summary."""

SAFETY = (
    "overlapping_accepted_writes",
    "token_order",
    "grant_order",
    "lost_increments",
    "unexplained_increments",
    "read_write_exclusion",
    "partial_multi_locks",
    "refused_live_holders",
    "holding_overlaps",
    "locks_after_clean",
    "waiters_after_clean",
)

DEATHS = ("kill", "kill-writer", "pause", "partition")
"""Faults after which a holder stops, or is out of reach: its locks must come free within
about a TTL (a partition of one worker; one of every worker leaves nobody to take them)."""

LATE_TOLERANCE = 0.05
"""Seconds a hold may run past its local deadline before it counts as held past it: the
lease timer's thread must wake, the loss's reporter thread start and the worker's main
thread wake on a loaded 2-core host (about a millisecond when idle)."""

LEASE_MARGIN = 0.1
"""The fraction of the TTL between a holder's local deadline and the first moment the
database may pass its locks on (`lockwarden.store.lease.MARGIN`)."""


@dataclass
class Op:
    """One operation: its invocation and (if it was recorded) its completion."""

    invoke: Record
    end: Record | None = None

    @property
    def process(self) -> str:
        return str(self.invoke["process"])

    @property
    def f(self) -> str:
        return str(self.invoke["f"])

    @property
    def type(self) -> str:
        return "info" if self.end is None else str(self.end["type"])

    @property
    def t0(self) -> float:
        return float(self.invoke["time"])

    @property
    def t1(self) -> float:
        """When it completed; infinity if that is unknown."""
        return math.inf if self.end is None else float(self.end["time"])

    def brief(self) -> dict[str, Any]:
        """The operation, for an example in the summary."""
        out = {k: v for k, v in self.invoke.items() if k not in ("type", "time", "op")}
        out.update({"type": self.type, "invoked": round(self.t0, 4)})
        if self.end is not None:
            out.update({k: v for k, v in self.end.items() if k not in ("type", "time", "op", "f")})
            out["completed"] = round(self.t1, 4)
        return out


@dataclass
class Hold:
    """A grant as its process saw it: from the acquire's completion to the release's invocation
    (or the process's end). The register operations it made are attached."""

    process: str
    acquire: Op
    modes: dict[str, str]
    tokens: dict[str, int]
    start: float
    end: float = math.inf
    ops: list[Op] = field(default_factory=list)
    released: Op | None = None
    stopped: Record | None = None
    """The worker's ``stopped`` record for this hold."""
    held_until: float = math.inf
    """The end of its holding interval (module doc, "Holding intervals")."""
    deadline: float | None = None
    """Its session's lease end as the worker recorded it (None: unknown, or none)."""
    told: float | None = None
    """When the library told its process the session was lost, if it did during the hold."""
    paused: bool = False
    """Its worker was paused (SIGSTOP) during the holding interval or the acquire that
    began it: left out."""


@dataclass
class History:
    config: dict[str, Any]
    ops: list[Op]
    holds: list[Hold]
    faults: list[Record]
    pids: dict[str, int]
    """Process -> pid of its worker."""
    started: dict[str, float]
    ended: dict[str, float]
    """Process -> when it retired, died, or the run ended."""
    retired: dict[str, str]
    """Process -> why it gave up its session."""
    final: Record | None
    crashes: list[Record]
    skipped: int
    slots: dict[str, int] = field(default_factory=dict)
    """Process -> its worker's slot."""
    lost: dict[str, Record] = field(default_factory=dict)
    """Process -> the ``lost`` record its ``on_lost`` wrote."""
    stops: dict[str, list[Record]] = field(default_factory=dict)
    """Process -> its ``stopped`` records, in order."""


def parse(records: Iterable[Record], skipped: int = 0) -> History:
    config: dict[str, Any] = {}
    ops: list[Op] = []
    open_ops: dict[tuple[str, int], Op] = {}
    faults: list[Record] = []
    pids: dict[str, int] = {}
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    retired: dict[str, str] = {}
    final = None
    crashes = []
    end_time = math.inf
    records = list(records)
    for record in records:
        kind = record["type"]
        if kind == "run":
            config = record["config"]
        elif kind == "invoke":
            op = Op(record)
            ops.append(op)
            open_ops[(op.process, record["op"])] = op
        elif kind in ("ok", "fail", "info"):
            found = open_ops.pop((str(record["process"]), record["op"]), None)
            if found is not None:
                found.end = record
        elif kind == "process":
            pids[record["process"]] = record["pid"]
            started[record["process"]] = record["time"]
        elif kind == "retire":
            ended[record["process"]] = record["time"]
            retired[record["process"]] = record["reason"]
        elif kind == "fault":
            faults.append(record)
        elif kind == "crash":
            crashes.append(record)
        elif kind == "end":
            end_time = record["time"]
        elif kind == "final":
            final = record
    for fault in faults:
        if fault["fault"] in ("kill", "kill-writer"):
            victim = _victim(fault, pids, started, ended)
            if victim is not None:
                ended[victim] = fault["time"]
    for process in started:
        ended.setdefault(process, end_time)
    history = History(
        config,
        ops,
        [],
        faults,
        pids,
        started,
        ended,
        retired,
        final,
        crashes,
        skipped,
        *_worker_notes(records),
    )
    history.holds = _holds(history)
    _holding_intervals(history)
    return history


def _worker_notes(
    records: Iterable[Record],
) -> tuple[dict[str, int], dict[str, Record], dict[str, list[Record]]]:
    """Each process's slot, its ``lost`` record and its ``stopped`` records."""
    slots: dict[str, int] = {}
    lost: dict[str, Record] = {}
    stops: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if record["type"] == "process" and "slot" in record:
            slots[record["process"]] = record["slot"]
        elif record["type"] == "stopped":
            stops[record["process"]].append(record)
        elif record["type"] == "lost":
            lost.setdefault(record["process"], record)
    return slots, lost, dict(stops)


def _victim(
    fault: Record, pids: dict[str, int], started: dict[str, float], ended: dict[str, float]
) -> str | None:
    """The process a fault on a pid hit: the last one that pid started before the fault."""
    candidates = [
        p
        for p, pid in pids.items()
        if pid == fault.get("pid")
        and started[p] <= fault["time"]
        and ended.get(p, math.inf) >= fault["time"]
    ]
    return max(candidates, key=started.__getitem__, default=None)


def _holds(history: History) -> list[Hold]:
    """Pair each granted acquire with the register operations and the release that followed."""
    holds: list[Hold] = []
    current: dict[str, Hold] = {}
    for op in history.ops:
        hold = current.get(op.process)
        if op.f == "acquire":
            if op.type == "ok":
                assert op.end is not None
                hold = Hold(
                    op.process,
                    op,
                    dict(op.invoke["locks"]),
                    {k: int(v) for k, v in op.end["tokens"].items()},
                    op.t1,
                )
                holds.append(hold)
                current[op.process] = hold
        elif hold is not None and op.f == "release":
            hold.end = op.t0
            hold.released = op
            del current[op.process]
        elif hold is not None:
            hold.ops.append(op)
    for hold in holds:
        hold.end = min(hold.end, history.ended.get(hold.process, math.inf))
    return holds


def _windows(h: History, begin: str, end: str, key: str) -> dict[Any, list[tuple[float, float]]]:
    """Spans between a fault and the fault that ends it (``begin``/``end``), by ``key`` of
    their records ("pid" for pauses, "slots" for partitions: one span per slot). A span
    never ended lasts to infinity."""
    spans: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    opened: dict[Any, float] = {}
    for fault in h.faults:
        if fault["fault"] not in (begin, end):
            continue
        keys = fault.get(key) if key == "slots" else [fault.get(key)]
        for k in keys or ():
            if fault["fault"] == begin:
                opened[k] = fault["time"]
            elif k in opened:
                spans[k].append((opened.pop(k), fault["time"]))
    for k, at in opened.items():
        spans[k].append((at, math.inf))
    return spans


def pauses(h: History) -> dict[Any, list[tuple[float, float]]]:
    """Pid -> the spans it was paused (SIGSTOP) by the nemesis."""
    return _windows(h, "pause", "resume", "pid")


def partitions(h: History) -> dict[Any, list[tuple[float, float]]]:
    """Worker slot -> the spans its proxies were frozen."""
    return _windows(h, "partition", "heal", "slots")


def _within(spans: Sequence[tuple[float, float]], start: float, end: float) -> bool:
    """Whether any span meets [start, end]."""
    return any(a <= end and b >= start for a, b in spans)


def _holding_intervals(h: History) -> None:
    """Set each hold's `Hold.held_until`, `deadline`, `told` and `paused` (module doc,
    "Holding intervals")."""
    by_process: dict[str, list[Hold]] = defaultdict(list)
    for hold in h.holds:
        by_process[hold.process].append(hold)
    paused = pauses(h)
    for process, holds in by_process.items():
        starts = [hold.start for hold in holds]
        for stop in h.stops.get(process, ()):
            i = bisect.bisect_right(starts, stop["time"]) - 1
            if i >= 0 and holds[i].stopped is None:
                holds[i].stopped = stop
        lost = h.lost.get(process)
        for hold in holds:
            until = hold.end  # the release's invocation, or the end of the process
            if hold.stopped is not None:
                until = min(until, hold.stopped["time"])
                hold.deadline = hold.stopped.get("deadline")
            if lost is not None and lost["time"] <= until:
                hold.told = lost["time"]
                until = min(until, lost["time"])
                if lost.get("deadline") is not None:
                    hold.deadline = lost["deadline"]
            accesses = [op.t0 for op in hold.ops if op.f in ("read", "write")]
            hold.held_until = max(hold.start, until, *accesses)
            spans = paused.get(h.pids.get(process), ())
            hold.paused = _within(spans, hold.acquire.t0, hold.held_until)


# -- the checks -----------------------------------------------------------------------


@dataclass
class Access:
    """An accepted (or unknown) register operation inside a hold."""

    hold: Hold
    op: Op
    name: str
    token: int


class Checker:
    def __init__(self, history: History) -> None:
        self.h = history
        self.violations: dict[str, int] = dict.fromkeys(SAFETY, 0)
        self.examples: dict[str, list[Any]] = defaultdict(list)
        self.reads: dict[str, list[Access]] = defaultdict(list)
        self.writes: dict[str, list[Access]] = defaultdict(list)
        self.unknown_writes: dict[str, list[Access]] = defaultdict(list)
        self.false_refusals = 0
        self.overtaken: set[int] = set()
        """The holds (their ids) that a later conflicting grant overlapped."""
        self.overtaking: set[int] = set()
        """The grants (their holds' ids) made while a conflicting hold went on."""
        for hold in history.holds:
            for op in hold.ops:
                if op.f not in ("read", "write"):
                    continue
                name = op.invoke["name"]
                access = Access(hold, op, name, int(op.invoke["token"]))
                if op.type == "ok":
                    (self.reads if op.f == "read" else self.writes)[name].append(access)
                elif op.type == "info" and op.f == "write":
                    self.unknown_writes[name].append(access)

    def flag(self, kind: str, example: Any, count: int = 1) -> None:
        self.violations[kind] += count
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(example)

    def run(self) -> None:
        names = sorted(set(self.writes) | set(self.reads) | set(self._final_registers()))
        for name in names:
            self.overlapping_writes(name)
            self.write_token_order(name)
            self.lost_increments(name)
            self.read_exclusion(name)
        self.grant_order()
        self.partial_multi_locks()
        self.refused_holders()
        self.holding_overlaps()
        self.leftovers()

    def _final_registers(self) -> dict[str, int]:
        return {} if self.h.final is None else dict(self.h.final["registers"])

    def _window(self, write: Access) -> tuple[float, float]:
        """From the completion of the write's own read to the write's invocation."""
        reads = [
            op.t1
            for op in write.hold.ops
            if op.f == "read" and op.invoke["name"] == write.name and op.type == "ok"
        ]
        return min(reads, default=write.hold.start), write.op.t0

    def overlapping_writes(self, name: str) -> None:
        windows = sorted((*self._window(w), i) for i, w in enumerate(self.writes[name]))
        latest: tuple[float, int] | None = None  # the window reaching furthest so far
        for start, end, i in windows:
            if latest is not None and start < latest[0]:
                a, b = self.writes[name][latest[1]], self.writes[name][i]
                self.flag("overlapping_accepted_writes", [a.op.brief(), b.op.brief()])
            if latest is None or end > latest[0]:
                latest = (end, i)

    def write_token_order(self, name: str) -> None:
        for a, b in _order_violations([(w.op.t0, w.op.t1, w.token, w) for w in self.writes[name]]):
            self.flag("token_order", [a.op.brief(), b.op.brief()])

    def grant_order(self) -> None:
        grants: dict[str, list[tuple[float, float, int, Hold]]] = defaultdict(list)
        for hold in self.h.holds:
            for name, token in hold.tokens.items():
                grants[name].append((hold.acquire.t0, hold.acquire.t1, token, hold))
        for name in sorted(grants):
            for a, b in _order_violations(grants[name]):
                self.flag("grant_order", [a.acquire.brief(), b.acquire.brief()])

    def lost_increments(self, name: str) -> None:
        final = self._final_registers().get(name)
        accepted = [int(w.op.invoke["value"]) for w in self.writes[name]]
        if final is None:
            return
        duplicates = len(accepted) - len(set(accepted))
        lost = max(duplicates, len(accepted) - final)
        unknown = len(self.unknown_writes[name])
        detail = {"register": name, "final": final, "accepted": len(accepted), "unknown": unknown}
        if lost > 0:
            self.flag("lost_increments", detail | {"duplicates": duplicates}, lost)
        if final > len(accepted) + unknown:
            self.flag("unexplained_increments", detail, final - len(accepted) - unknown)

    def read_exclusion(self, name: str) -> None:
        writes = sorted(self.writes[name], key=lambda w: w.token)
        write_tokens = [w.token for w in writes]
        highest = list(itertools.accumulate((int(w.op.invoke["value"]) for w in writes), max))
        by_hold: dict[int, list[Access]] = defaultdict(list)
        for read in self.reads[name]:
            if read.hold.modes[name] == "read":
                by_hold[id(read.hold)].append(read)
        for reads in by_hold.values():
            seen = [int(r.op.end["value"]) for r in reads if r.op.end is not None]
            token = reads[0].token
            older = bisect.bisect_left(write_tokens, token)  # writes with a smaller token
            expected = highest[older - 1] if older else 0
            allowed = {expected} | {
                int(w.op.invoke["value"]) for w in self.unknown_writes[name] if w.token < token
            }
            if len(set(seen)) > 1 or not set(seen) <= allowed:
                self.flag(
                    "read_write_exclusion",
                    {"reads": [r.op.brief() for r in reads], "expected": sorted(allowed)},
                )

    def partial_multi_locks(self) -> None:
        for op in self.h.ops:
            if op.f == "acquire" and op.type == "ok" and op.end is not None:
                names = {name for name, _ in op.invoke["locks"]}
                if set(op.end["tokens"]) != names:
                    self.flag("partial_multi_locks", op.brief())
            elif (
                op.f == "held"
                and op.type == "ok"
                and op.end is not None
                and op.end["held"]
                and not op.end.get("releasing")  # else a pending clean-up may hold them
            ):
                self.flag("partial_multi_locks", op.brief())

    def refused_holders(self) -> None:
        """A refusal by the register, then a passing ``check``: was the holder overtaken?

        The check proves the hold lasted from its grant until the check ran
        (rows never come back). A grant of the name with a newer token, in a
        conflicting mode, completed before the check began therefore
        overlapped it: two holders at once, whatever the fence did.
        """
        for hold in self.h.holds:
            refused = [o for o in hold.ops if o.f in ("read", "write") and o.type == "fail"]
            checks = [o for o in hold.ops if o.f == "check" and o.type == "ok"]
            if not refused or not checks:
                continue
            name = refused[0].invoke["name"]
            token, mode = hold.tokens[name], hold.modes[name]
            overtaken = [
                h
                for h in self.h.holds
                if h.tokens.get(name, -1) > token
                and h.acquire.t1 < checks[0].t0
                and "write" in (mode, h.modes[name])
            ]
            if overtaken:
                ops = [*refused, *checks, overtaken[0].acquire]
                self.flag("refused_live_holders", [o.brief() for o in ops])
            else:
                self.false_refusals += 1

    def holding_overlaps(self) -> None:
        """Two holds of a name in conflicting modes, by different processes, neither paused,
        whose holding intervals overlap (each began before the other ended)."""
        by_name: dict[str, list[Hold]] = defaultdict(list)
        for hold in self.h.holds:
            if not hold.paused:
                for name in hold.modes:
                    by_name[name].append(hold)
        for name, holds in sorted(by_name.items()):
            active: list[Hold] = []
            for hold in sorted(holds, key=lambda x: x.start):
                active = [a for a in active if a.held_until > hold.start]
                for other in active:
                    if other.process != hold.process and "write" in (
                        other.modes[name],
                        hold.modes[name],
                    ):
                        self.flag("holding_overlaps", [_held(other, name), _held(hold, name)])
                        self.overtaken.add(id(other))
                        self.overtaking.add(id(hold))
                active.append(hold)

    def leftovers(self) -> None:
        if self.h.final is None:
            return
        for key, kind in (("locks", "locks_after_clean"), ("waiters", "waiters_after_clean")):
            for row in self.h.final[key]:
                self.flag(kind, row)


def _held(hold: Hold, name: str) -> dict[str, Any]:
    """A hold of ``name``, for an example in the summary."""
    return {
        "process": hold.process,
        "name": name,
        "mode": hold.modes[name],
        "token": hold.tokens.get(name),
        "start": round(hold.start, 4),
        "held_until": round(hold.held_until, 4),
        "stopped": None if hold.stopped is None else hold.stopped.get("reason"),
        "told": None if hold.told is None else round(hold.told, 4),
        "deadline": None if hold.deadline is None else round(hold.deadline, 4),
    }


def _order_violations(
    items: Sequence[tuple[float, float, int, Any]],
) -> list[tuple[Any, Any]]:
    """Pairs (a, b) where a certainly came before b (a completed before b was invoked)
    but b's token is not larger than a's. Items: (invoked, completed, token, what)."""
    by_start = sorted(range(len(items)), key=lambda i: items[i][0])
    by_end = sorted(range(len(items)), key=lambda i: items[i][1])
    found = []
    highest: int | None = None  # the item with the largest token among those completed
    j = 0
    for i in by_start:
        while j < len(by_end) and items[by_end[j]][1] < items[i][0]:
            k = by_end[j]
            if highest is None or items[k][2] > items[highest][2]:
                highest = k
            j += 1
        if highest is not None and items[highest][2] >= items[i][2]:
            found.append((items[highest][3], items[i][3]))
    return found


# -- liveness and what else the run shows ---------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (None without values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def liveness(h: History) -> dict[str, Any]:
    """How long a dead (killed, paused or cut off) write holder kept the next requester of its locks
    waiting: the name came free when its lease ran out, if the store is live."""
    ttl = float(h.config.get("ttl", 0))
    grants: dict[str, list[Hold]] = defaultdict(list)
    holds_of: dict[str, list[Hold]] = defaultdict(list)
    for hold in sorted(h.holds, key=lambda x: x.acquire.t1):
        holds_of[hold.process].append(hold)
        for name in hold.tokens:
            grants[name].append(hold)
    granted_at = {name: [g.acquire.t1 for g in found] for name, found in grants.items()}
    cut_off = partitions(h)
    recoveries: list[tuple[float, dict[str, Any]]] = []
    unmeasured = 0
    partitioned = 0
    for fault in h.faults:
        if (
            fault["fault"] not in DEATHS
            or (victim := _victim(fault, h.pids, h.started, {})) is None
        ):
            continue
        died = fault["time"]
        for hold in holds_of[victim]:
            if not hold.start <= died <= hold.end:
                continue
            # Only write locks: a dead reader's name may be held by live readers too,
            # whom the next writer waits for as well (a pause of one of them included).
            for name in (n for n, mode in hold.modes.items() if mode == "write"):
                after = bisect.bisect_right(granted_at[name], died)
                grant = next((g for g in grants[name][after:] if g.process != victim), None)
                if grant is None or grant.acquire.t0 > died + ttl:
                    unmeasured += 1  # nobody wanted the name soon after: nothing to measure
                    continue
                if _within(cut_off.get(h.slots.get(grant.process), ()), died, grant.acquire.t1):
                    partitioned += 1  # it would measure the taker's partition
                    continue
                took = grant.acquire.t1 - died
                example = {"fault": fault["fault"], "name": name, "seconds": round(took, 3)}
                recoveries.append((took, example))
    seconds = [took for took, _ in recoveries]
    worst = max(recoveries, key=lambda r: r[0], default=(None, None))[1]
    return {
        "ttl": ttl,
        "recoveries": len(seconds),
        "unmeasured": unmeasured,
        "partitioned": partitioned,
        "p50": _round(_percentile(seconds, 50)),
        "p99": _round(_percentile(seconds, 99)),
        "max": _round(_percentile(seconds, 100)),
        "max_in_ttls": _round(max(seconds) / ttl if seconds and ttl else None),
        "worst": worst,
        "restarts": _restarts(h),
        "longest_silence": _longest_silence(h),
    }


def _longest_silence(h: History) -> dict[str, Any]:
    """The longest a process went without recording anything: a hang would show here.

    Waiting out an acquire's timeout (2.5 TTLs) or a pause (up to 2.5 TTLs) is normal.
    """
    times: dict[str, list[float]] = defaultdict(list)
    for op in h.ops:
        times[op.process] += [op.t0] if op.end is None else [op.t0, op.t1]
    longest, who = 0.0, None
    for process, seen in times.items():
        ends = [h.started.get(process, seen[0]), h.ended.get(process, seen[-1])]
        ordered = sorted([*seen, *(t for t in ends if math.isfinite(t))])
        gap = max((b - a for a, b in itertools.pairwise(ordered)), default=0.0)
        if gap > longest:
            longest, who = gap, process
    return {"seconds": _round(longest), "process": who}


def _restarts(h: History) -> list[dict[str, Any]]:
    """Each database restart: how long it took, and how long until the next grant after it."""
    out = []
    begun, wall = None, None
    for fault in h.faults:
        if fault["fault"] == "restart":
            begun, wall = fault["time"], fault.get("wall")
        elif fault["fault"] == "restarted" and begun is not None:
            done = fault["time"]
            after = min((x.acquire.t1 for x in h.holds if x.acquire.t1 > done), default=None)
            out.append(
                {
                    "at": wall,
                    "seconds": _round(done - begun),
                    "returncode": fault.get("returncode"),
                    "next_grant_after": _round(None if after is None else after - done),
                }
            )
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def observations(h: History, checker: Checker) -> dict[str, Any]:
    """What the faults did, short of a violation: fenced-off accesses, overlapping holds, ..."""
    fenced = Counter(
        hold.modes[op.invoke["name"]]
        for hold in h.holds
        for op in hold.ops
        if op.f in ("read", "write") and op.type == "fail"
    )
    outlived: set[int] = set()  # write holds that a later grant of the name overlapped
    overtaking = 0  # grants made while an older write hold was still believed
    by_name: dict[str, list[Hold]] = defaultdict(list)
    for hold in h.holds:
        for name, mode in hold.modes.items():
            if mode == "write":
                by_name[name].append(hold)
    for holds in by_name.values():
        reach: Hold | None = None
        for hold in sorted(holds, key=lambda x: x.start):
            if reach is not None and hold.start < reach.end:
                outlived.add(id(reach))
                overtaking += 1
            if reach is None or hold.end > reach.end:
                reach = hold
    retired = Counter(
        "session lost" if r.startswith("the session was lost") else "unknown outcome"
        for r in h.retired.values()
    )
    return {
        "fenced_off": {"read": fenced["read"], "write": fenced["write"]},
        "false_refusals": checker.false_refusals,
        "write_holds_outliving_their_lease": len(outlived),
        "grants_overtaking_them": overtaking,
        "releases_reporting_loss": sum(
            1 for x in h.holds if x.released is not None and x.released.type == "fail"
        ),
        "processes_retired": dict(retired),
    }


def holding(h: History, checker: Checker) -> dict[str, Any]:
    """The holding intervals at a glance: how the holds ended, how late against their local
    deadlines, and what the partitions cut short (module doc, "Holding intervals")."""
    ttl = float(h.config.get("ttl", 0))
    measured = [hold for hold in h.holds if not hold.paused]
    late = [
        hold.held_until - hold.deadline
        for hold in measured
        if hold.deadline is not None and math.isfinite(hold.held_until)
    ]
    after_loss = [
        hold.held_until - hold.deadline
        for hold in measured
        if hold.told is not None and hold.deadline is not None
    ]
    released = [
        float(hold.stopped["lease_left"])
        for hold in measured
        if hold.stopped is not None
        and hold.stopped.get("reason") == "release"
        and not hold.stopped.get("told")  # a last access that returned after the loss
        and hold.stopped.get("lease_left") is not None
    ]
    past = [x for x in late if x > LATE_TOLERANCE]
    dead_on_arrival = [
        hold for hold in h.holds if hold.deadline is not None and hold.start > hold.deadline
    ]
    cut_off = partitions(h)
    cut_short = [
        hold
        for hold in measured
        if hold.told is not None
        and _within(cut_off.get(h.slots.get(hold.process), ()), hold.told, hold.told)
    ]
    grants: dict[str, list[Hold]] = defaultdict(list)
    for hold in sorted(h.holds, key=lambda x: x.start):
        for name in hold.modes:
            grants[name].append(hold)
    starts = {name: [g.start for g in found] for name, found in grants.items()}
    leads = [lead for hold in cut_short if (lead := _lead(grants, starts, hold)) is not None]
    spans = [f for f in h.faults if f["fault"] == "partition"]
    return {
        "tolerance": LATE_TOLERANCE,
        "holds": len(measured),
        "paused_left_out": len(h.holds) - len(measured),
        "stopped": dict(
            Counter(
                hold.stopped["reason"] if hold.stopped is not None else "no record"
                for hold in measured
            )
        ),
        "told_while_holding": sum(1 for hold in measured if hold.told is not None),
        "holds_overtaken": len(checker.overtaken),
        "grants_overtaking": len(checker.overtaking),
        "held_past_local_deadline": len(past),
        "beyond_margin": sum(1 for x in late if x > LEASE_MARGIN * ttl),
        "after_deadline": {
            "measured": len(after_loss),
            "p50": _round(_percentile(after_loss, 50)),
            "max": _round(_percentile(after_loss, 100)),
        },
        "least_lease_left_at_release": _round(min(released, default=None)),
        "granted_past_deadline": len(dead_on_arrival),
        "granted_past_deadline_examples": [
            {
                "process": hold.process,
                "tokens": hold.tokens,
                "invoked": round(hold.acquire.t0, 4),
                "granted": round(hold.start, 4),
                "deadline": round(hold.deadline, 4),
                "told": None if hold.told is None else round(hold.told, 4),
                "paused": hold.paused,
            }
            for hold in dead_on_arrival[:EXAMPLES]
            if hold.deadline is not None
        ],
        "partitions": len(spans),
        "partitions_of_every_worker": sum(1 for f in spans if f.get("slot") is None),
        "cut_short_by_partition": len(cut_short),
        "lead_over_next_grant": {
            "measured": len(leads),
            "min": _round(min(leads, default=None)),
            "p50": _round(_percentile(leads, 50)),
        },
    }


def _lead(
    grants: dict[str, list[Hold]], starts: dict[str, list[float]], hold: Hold
) -> float | None:
    """How long before the next conflicting grant of one of its names, to another process,
    the hold's interval ended (negative: an overlap); None if no such grant came.
    ``grants``: each name's holds by their start; ``starts``: those starts."""
    nexts = []
    for name, mode in hold.modes.items():
        later = grants[name][bisect.bisect_right(starts[name], hold.start) :]
        nexts += [
            other.start
            for other in later
            if other.process != hold.process and "write" in (mode, other.modes[name])
        ][:1]
    return None if not nexts else min(nexts) - hold.held_until


def summarize(h: History) -> dict[str, Any]:
    checker = Checker(h)
    checker.run()
    ops: dict[str, Counter[str]] = defaultdict(Counter)
    for op in h.ops:
        ops[op.f][op.type] += 1
    registers = {
        name: {
            "final": value,
            "accepted": len(checker.writes[name]),
            "unknown": len(checker.unknown_writes[name]),
        }
        for name, value in checker._final_registers().items()
    }
    valid = not h.crashes and h.final is not None
    return {
        "run": {
            k: h.config.get(k)
            for k in (
                "backend",
                "seed",
                "duration",
                "workers",
                "names",
                "ttl",
                "fencing",
                "allow_restart",
                "crash",
                "durability",
                "clock_steps",
                "fault_every",
                "hold",
                "think",
                "run_id",
            )
        }
        | {
            "partitions": bool(h.config.get("proxies")),
            "local_deadline": h.config.get("local_deadline", True),
        },
        "safe": not any(checker.violations.values()),
        "valid": valid,
        "history": {
            "processes": len(h.started),
            "worker_crashes": len(h.crashes),
            "unparsed_lines": h.skipped,
            "final_state_recorded": h.final is not None,
        },
        "operations": {"total": len(h.ops)} | {f: dict(c) for f, c in sorted(ops.items())},
        "faults": dict(Counter(f["fault"] for f in h.faults)),
        "violations": checker.violations,
        "examples": dict(checker.examples),
        "observations": observations(h, checker),
        "holding": holding(h, checker),
        "liveness": liveness(h),
        "registers": registers,
        "cleaned": None if h.final is None else h.final.get("cleaned"),
        "reclaimed": None if h.final is None else h.final.get("reclaimed"),
    }


def report(summary: dict[str, Any]) -> str:
    """The summary in words, for a person."""
    run, ops, live = summary["run"], summary["operations"], summary["liveness"]
    fencing = "on" if run["fencing"] else "OFF (control run)"
    deadline = "" if run.get("local_deadline", True) else ", local deadline OFF (control run)"
    lines = [
        f"chaos run {run['run_id']}: {run['backend']}, {run['duration']:g} s, seed {run['seed']}, "
        f"{run['workers']} workers, {run['names']} names, TTL {run['ttl']:g} s, fencing {fencing}"
        + deadline,
        f"operations: {ops['total']}; "
        + "; ".join(
            f"{f} " + " / ".join(f"{t} {n}" for t, n in sorted(c.items()))
            for f, c in ops.items()
            if f != "total"
        ),
        "faults: " + ", ".join(f"{k} {n}" for k, n in sorted(summary["faults"].items())),
    ]
    bad = {k: n for k, n in summary["violations"].items() if n}
    lines.append(
        "SAFE: no violation"
        if not bad
        else "UNSAFE: " + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in bad.items())
    )
    if not summary["valid"]:
        hist = summary["history"]
        lines.append(
            f"NOT VALID: {hist['worker_crashes']} worker crashes (see the workers' log), "
            f"final state recorded: {hist['final_state_recorded']}"
        )
    seen = summary["observations"]
    lines.append(
        f"fencing at work: {seen['fenced_off']['write']} writes and {seen['fenced_off']['read']} "
        f"reads turned away; {seen['write_holds_outliving_their_lease']} write holders outlived "
        f"their lease ({seen['grants_overtaking_them']} grants made meanwhile); "
        f"{seen['false_refusals']} refusals of holders nobody overtook"
    )
    held = summary.get("holding")
    if held is not None:  # older summaries lack it
        lines.append(_holding_line(held))
    if live["recoveries"]:
        lines.append(
            f"liveness: {live['recoveries']} recoveries after a write holder died: "
            f"p50 {live['p50']} s, p99 {live['p99']} s, max {live['max']} s "
            f"({live['max_in_ttls']} TTL); "
            f"{live['unmeasured']} deaths with nobody waiting"
        )
    lines.append(
        f"longest silence of a process: {live['longest_silence']['seconds']} s "
        "(an acquire timing out or a pause: about 5 s; a hang: much more)"
    )
    if summary.get("reclaimed") is not None:  # older summaries lack it
        lines.append(
            f"locks reclaimed from dead holders (the store's count): {summary['reclaimed']}"
        )
    for restart in live["restarts"]:
        lines.append(
            f"database restart at {restart['at']}: {restart['seconds']} s, next grant "
            f"{restart['next_grant_after']} s later"
        )
    registers = summary["registers"]
    lines.append(
        "registers: "
        + ", ".join(
            f"{n}={r['final']} ({r['accepted']} accepted, {r['unknown']} unknown)"
            for n, r in registers.items()
        )
    )
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value} s"


def _holding_line(held: dict[str, Any]) -> str:
    after, lead = held["after_deadline"], held["lead_over_next_grant"]
    line = (
        f"holding intervals: {held['holds']} holds ({held['paused_left_out']} paused, left out), "
        f"{held['holds_overtaken']} overlapped by {held['grants_overtaking']} later grants; "
        f"{held['told_while_holding']} told of a loss "
        f"while holding, stopped after the local deadline by p50 {_seconds(after['p50'])}, "
        f"max {_seconds(after['max'])}; {held['held_past_local_deadline']} held past it by more "
        f"than {held['tolerance']:g} s ({held['beyond_margin']} beyond the margin); least lease "
        f"left at a release {_seconds(held['least_lease_left_at_release'])}; "
        f"{held.get('granted_past_deadline', 0)} grants returned after their lease's end"
    )
    if held["partitions"]:
        line += (
            f"\npartitions: {held['partitions']} ({held['partitions_of_every_worker']} of every "
            f"worker); {held['cut_short_by_partition']} holds cut short, each stopped ahead of "
            f"the next conflicting grant by min {_seconds(lead['min'])}, "
            f"p50 {_seconds(lead['p50'])} ({lead['measured']} followed by one)"
        )
    return line


def check_file(path: Path, json_path: Path | None = None) -> dict[str, Any]:
    """Check a history file, write the JSON summary, return it."""
    records, skipped = load_history(path)
    summary = summarize(parse(records, skipped))
    target = json_path or path.with_suffix(".summary.json")
    target.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("history", type=Path)
    parser.add_argument("--json", type=Path, help="where to write the JSON summary")
    args = parser.parse_args(argv)
    summary = check_file(args.history, args.json)
    print(report(summary))
    return 0 if summary["safe"] and summary["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
