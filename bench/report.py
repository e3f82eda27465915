"""The store benchmark's results as Markdown tables and a PNG plot."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from subjects import BACKENDS, BY_KEY, POSTGRES, floor_of

Results = dict[str, Any]

FLAT_BOUND = 1.25
"""Acquire with 100,000 other locks counts as flat within this factor of an empty table's."""


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _times(value: float | None, base: float | None) -> str:
    return _ratio(None if value is None or not base else value / base)


def _over(value: float | None, base: float | None) -> str:
    return "" if value is None or not base else f" ({_times(value, base)})"


def _subject(key: str) -> str:
    """A subject's label, lockwarden's in bold."""
    label: str = BY_KEY[key].label
    return f"**{label}**" if key.startswith("lockwarden") else label


def _get(results: Results, measure: str, key: str, field: str) -> Any:
    return results.get(measure, {}).get(key, {}).get(field)


def _trips(counted: dict[str, float] | None) -> str:
    """Round trips of acquire / release, and the connections they opened, if any."""
    if not counted:
        return "-"
    text = f"{counted['acquire_round_trips']:g} / {counted['release_round_trips']:g}"
    opened = counted["acquire_connections"] + counted["release_connections"]
    return f"{text} (+{opened:g} connection)" if opened else text


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _ran(results: Results, measure: str) -> list[str]:
    """Keys of the subjects measured by ``measure`` without an error, in the subjects' order."""
    done = results.get(measure, {})
    return [k for k in BY_KEY if k in done and "error" not in done[k]]


def pair_ratio(results: Results, key: str, other: str | None) -> float | None:
    mine, base = (_get(results, "uncontended", k, "pair_us") for k in (key, other or ""))
    return mine / base if mine and base else None


def markdown(results: Results) -> str:
    out: list[str] = []
    meta = results["meta"]
    out += [
        f"Run {meta['date']} · {meta['cpus']} CPUs · Python {meta['python']} · "
        f"{meta['postgres']} (synchronous_commit={meta['synchronous_commit']}) · "
        f"Redis {meta['redis']} · lockwarden: {meta['lockwarden']}"
        + (" · **quick run**" if meta["quick"] else ""),
        "",
        "**Uncontended acquire + release** (one process, one free lock; best of "
        f"{meta['plan']['repeat']} batches; round trips counted on the wire)",
        "",
    ]
    rows = []
    for key in _ran(results, "uncontended"):
        cls = BY_KEY[key]
        floor = floor_of(cls.backend)
        rows.append(
            [
                cls.backend,
                _subject(key),
                _f(_get(results, "uncontended", key, "acquire_us")),
                _f(_get(results, "uncontended", key, "release_us")),
                _f(_get(results, "uncontended", key, "pair_us")),
                _ratio(pair_ratio(results, key, floor.key if floor else None)),
                _ratio(pair_ratio(results, key, "pg-advisory")) if cls.backend == POSTGRES else "-",
                _trips(results.get("round_trips", {}).get(key)),
            ]
        )
    out += _table(
        [
            "backend",
            "subject",
            "acquire µs",
            "release µs",
            "pair µs",
            "x floor",
            "x advisory pair",
            "round trips (acq / rel)",
        ],
        rows,
    )
    own = {
        BY_KEY[k].label: c["own_statements_per_pair"]
        for k, c in results.get("round_trips", {}).items()
        if "own_statements_per_pair" in c
    }
    if own:
        out += [
            "",
            "Statements sent per acquire + release by lockwarden's own count (`store.stats`): "
            + ", ".join(f"{label} {n:g}" for label, n in own.items())
            + ".",
        ]
    if cost := results.get("observer_cost"):
        out += [
            "",
            "Hooks (lockwarden on SQLite, the pair above): "
            f"{_f(cost['without_us'])} µs with no observer, {_f(cost['with_us'])} µs with a "
            f"`PrometheusObserver` subscribed; unobserved, each event costs one "
            f"{_f(cost['check_ns'])} ns check (two per pair).",
        ]
    out += [
        "",
        f"**Handoff** (2 processes: release → the blocked waiter holds it; "
        f"{meta['plan']['handoff_rounds']} handoffs) and **contended throughput** "
        f"({meta['plan']['processes']} processes looping on one lock for "
        f"{meta['plan']['throughput_seconds']:g} s, on {meta['cpus']} CPUs)",
        "",
    ]
    rows = []
    depths = meta["plan"].get("queue_depths", ())
    for key in [k for k in BY_KEY if k in results.get("handoff", {})]:
        cls, hand, thr = BY_KEY[key], results["handoff"][key], results["throughput"].get(key, {})
        queued = results.get("queued_handoff", {}).get(key, {})
        shares = thr.get("shares") or []
        rows.append(
            [
                cls.backend,
                _subject(key),
                _f(hand.get("median_ms"), 2),
                _f(hand.get("p99_ms"), 2),
                *(_f(queued.get(str(d), {}).get("median_ms"), 2) for d in depths),
                _f(thr.get("per_second")),
                f"{min(shares):.0%} - {max(shares):.0%}" if shares else "-",
                {True: "yes", False: "**NO**"}.get(thr.get("exclusive"), "-"),
                hand.get("error", "") + thr.get("error", ""),
            ]
        )
    out += _table(
        [
            "backend",
            "subject",
            "handoff median ms",
            "handoff p99 ms",
            *(f"handoff with {d} queued, median ms" for d in depths),
            "acquisitions/s",
            "share per process (min - max)",
            "exclusive",
            "error",
        ],
        rows,
    )
    costs = {
        BY_KEY[key].label + f" ({BY_KEY[key].backend})": thr
        for key, thr in results.get("throughput", {}).items()
        if "statements_per_acquisition" in thr
    }
    if costs:
        out += [
            "",
            "What one acquisition (with its release) cost under contention, by lockwarden's "
            "own counters: statements (each one transaction: a commit), attempts, and waits "
            "(each time a waiter woke: a grant handed over, a wake-up, a recheck), of which "
            "grants handed over by the releaser",
            "",
        ]
        out += _table(
            ["subject", "statements", "attempts", "waits", "handed over"],
            [
                [
                    label,
                    *(
                        _f(thr.get(f"{k}_per_acquisition"), 2)
                        for k in ("statements", "attempts", "waits", "handed")
                    ),
                ]
                for label, thr in costs.items()
            ],
        )
    crowds = results.get("crowd", {})
    if crowds:
        out += [
            "",
            "**Many processes** (lockwarden, durable, and on PostgreSQL the durable hand-off "
            "floor: each process loops on one of a few names for "
            f"{meta['plan']['throughput_seconds']:g} s; over {meta['plan']['processes']} "
            "processes: the rate over the "
            "same subject's contended throughput; waits from the call to the grant; fair: "
            "the fewest acquisitions of any process over the most)",
            "",
        ]
        out += _table(
            [
                "backend",
                "subject",
                "processes",
                "names",
                "acquisitions/s",
                f"over {meta['plan']['processes']} processes",
                "wait median ms",
                "wait p99 ms",
                "wait max ms",
                "fair",
                "exclusive",
                "error",
            ],
            [
                [
                    BY_KEY[key].backend,
                    _subject(key),
                    str(found.get("processes", "-")),
                    str(found.get("names", "-")),
                    _f(found.get("per_second")),
                    _times(found.get("per_second"), _get(results, "throughput", key, "per_second")),
                    _f(found.get("median_wait_ms"), 2),
                    _f(found.get("p99_wait_ms"), 1),
                    _f(found.get("max_wait_ms"), 1),
                    _f(found.get("fair"), 2),
                    {True: "yes", False: "**NO**"}.get(found.get("exclusive"), "-"),
                    found.get("error", ""),
                ]
                for key, found in crowds.items()
            ],
        )
    neighbours = results.get("neighbours", {})
    if neighbours:
        out += [
            "",
            "**Idle neighbours** (lockwarden, durable: "
            f"{meta['plan']['processes']} processes loop on one lock "
            f"for {meta['plan']['throughput_seconds']:g} s, as in contended throughput, "
            "while other processes of the same database sit idle, each store having "
            f"waited once {meta['plan']['neighbours_quiet']:g} s before; in brackets, over "
            "contended throughput without them)",
            "",
        ]
        out += _table(
            ["backend", "idle processes", "acquisitions/s", "exclusive", "error"],
            [
                [
                    BY_KEY[key].backend,
                    str(found.get("idle", "-")),
                    _f(per_second := found.get("per_second"))
                    + _over(per_second, _get(results, "throughput", key, "per_second")),
                    {True: "yes", False: "**NO**"}.get(found.get("exclusive"), "-"),
                    found.get("error", ""),
                ]
                for key, found in neighbours.items()
            ],
        )
    flat = list(_flat_series(results))
    if flat:
        levels = meta["plan"]["flat_levels"]
        out += [
            "",
            "**Flatness**: lockwarden acquire of a never-used name, µs, with other locks held "
            "by another session or by the measuring session itself; in brackets, over the same "
            "acquire on an empty table measured in alternate batches",
            "",
        ]
        out += _table(
            ["backend", "others held by", *(f"{x:,} others" for x in levels)],
            [
                [
                    BY_KEY[key].backend,
                    HOLDERS[holder],
                    *(
                        f"{by_level[str(x)]['acquire_us']:,.0f} ({by_level[str(x)]['ratio']:.2f}x)"
                        for x in levels
                    ),
                ]
                for key, holder, by_level in flat
            ],
        )
    breakdown = results.get("breakdown")
    if breakdown:
        out += [
            "",
            "**PostgreSQL: where the time goes** (µs per call: the client's time; the median "
            "time beyond the round-trip counter, i.e. server work, commit flush, a loopback hop "
            "and the counter's own delay; the difference, spent on the client's side. The "
            "floors' client side is a bare driver call, so their figure shows the counter's "
            "bias: compare lockwarden's with theirs)",
            "",
        ]
        out += _table(
            [
                "subject",
                "acquire",
                "beyond the counter",
                "client side",
                "release",
                "beyond the counter",
                "client side",
            ],
            [
                [BY_KEY[key].label]
                + [
                    _f(part[call][k])
                    for call in ("acquire", "release")
                    for k in ("client", "server", "rest")
                ]
                for key, part in breakdown.items()
            ],
        )
    out += ["", "**Targets**", ""]
    out += _table(
        ["target", "measured", "met"],
        [[t["target"], t["measured"], t["verdict"]] for t in results.get("targets", [])],
    )
    out += ["", "**Subjects**", ""]
    out += _table(
        ["backend", "subject", "configuration"],
        [
            [BY_KEY[key].backend, BY_KEY[key].label, BY_KEY[key].config]
            for key in results["subjects"]
        ],
    )
    skipped = results["skipped"]
    if skipped:
        out += ["", "Not measured: " + "; ".join(f"{k} ({why})" for k, why in skipped.items())]
    return "\n".join(out) + "\n"


def targets(results: Results) -> list[dict[str, str]]:
    """The store's speed targets (and relaxed durability's aim), each against this run."""
    found: list[dict[str, str]] = []

    def add(target: str, value: float | None, show: Callable[[float], str], ok: bool) -> None:
        if value is not None:
            found.append({"target": target, "measured": show(value), "verdict": _verdict(ok)})

    def at_most(target: str, ratio: float | None, bound: float) -> None:
        add(target, ratio, _ratio, ratio is not None and ratio <= bound)

    def at_least(target: str, per_second: float | None, bound: float) -> None:
        add(target, per_second, _f, per_second is not None and per_second >= bound)

    for call in ("acquire", "release"):
        trips = _get(results, "round_trips", "lockwarden-pg", f"{call}_round_trips")
        add(f"{call} = 1 round trip", trips, lambda v: f"{v:g}", trips == 1)
    at_most(
        "PostgreSQL pair <= 2x advisory-lock pair",
        pair_ratio(results, "lockwarden-pg", "pg-advisory"),
        2,
    )
    at_most(
        '… with durability="relaxed" (opt-in)',
        pair_ratio(results, "lockwarden-pg-relaxed", "pg-advisory"),
        2,
    )
    tooz = pair_ratio(results, "lockwarden-pg", "tooz-pg")
    add("PostgreSQL pair faster than tooz", tooz, _ratio, bool(tooz and tooz < 1))
    at_most(
        "(relaxed aim) PostgreSQL pair <= 1.25x the floor",
        pair_ratio(results, "lockwarden-pg", "pg-floor"),
        1.25,
    )
    hand = _get(results, "handoff", "lockwarden-pg", "median_ms")
    p99 = _get(results, "handoff", "lockwarden-pg", "p99_ms")
    advisory = _get(results, "handoff", "pg-advisory", "median_ms")
    add(
        "PostgreSQL handoff: median <= 1.0 ms and <= 1.3x the advisory lock's, p99 <= 3 ms",
        hand,
        lambda v: (
            f"median {v:.2f} ms ({v / advisory:.2f}x), p99 {p99:.2f} ms"
            if advisory
            else f"median {v:.2f} ms, p99 {p99:.2f} ms"
        ),
        bool(hand and advisory and hand <= 1.0 and hand <= 1.3 * advisory and p99 <= 3),
    )
    at_most(
        "PostgreSQL handoff with 16 queued <= 1.2x with 1 queued",
        _get(results, "queued_handoff", "lockwarden-pg", "ratio"),
        1.2,
    )
    per_s = _get(results, "throughput", "lockwarden-pg", "per_second")
    at_least("PostgreSQL contended (4 processes) >= 1,500 /s", per_s, 1500)
    at_most(
        "SQLite pair <= 1.3x the floor",
        pair_ratio(results, "lockwarden-sqlite", "sqlite-floor"),
        1.3,
    )
    at_most(
        'SQLite with durability="relaxed": pair at or below filelock\'s',
        pair_ratio(results, "lockwarden-sqlite-relaxed", "filelock"),
        1.0,
    )
    sqlite_hand = _get(results, "handoff", "lockwarden-sqlite", "median_ms")
    add(
        "SQLite handoff <= 2 ms",
        sqlite_hand,
        lambda v: f"median {v:.2f} ms",
        bool(sqlite_hand and sqlite_hand <= 2),
    )
    at_least(
        "SQLite contended (4 processes) >= 1,000 /s",
        _get(results, "throughput", "lockwarden-sqlite", "per_second"),
        1000,
    )
    many = results.get("crowd", {}).get("lockwarden-sqlite", {})
    if "per_second" in many:
        add(
            f"SQLite, {many['processes']} processes on {many['names']} names: >= 300 /s, "
            "p99 wait <= 1 s, every process served alike (fair >= 0.8)",
            many["per_second"],
            lambda v, m=many: f"{v:,.0f} /s, p99 {m['p99_wait_ms']:,.0f} ms, fair {m['fair']:.2f}",
            many["per_second"] >= 300 and many["p99_wait_ms"] <= 1000 and many["fair"] >= 0.8,
        )
    if per_s is not None:
        at_least(
            f"PostgreSQL, {_get(results, 'crowd', 'lockwarden-pg', 'processes')} processes: "
            "no lower than with 4",
            _get(results, "crowd", "lockwarden-pg", "per_second"),
            per_s,
        )
    for key in ("lockwarden-pg", "lockwarden-sqlite"):
        shares = _get(results, "throughput", key, "shares")
        if shares:
            add(
                f"{BY_KEY[key].backend} contended shares 20-30% each (FIFO)",
                min(shares),
                lambda _v, s=shares: f"{min(s):.0%} - {max(s):.0%}",
                min(shares) >= 0.2 and max(shares) <= 0.3,
            )
    for key, holder, by_level in _flat_series(results):
        top = list(by_level)[-1]
        ratio = by_level[top]["ratio"]
        add(
            f"acquire flat with {int(top):,} other locks ({BY_KEY[key].backend}, held by "
            f"{HOLDERS[holder]}): <= {FLAT_BOUND}x the empty table",
            ratio,
            _ratio,
            ratio <= FLAT_BOUND,
        )
    return found


HOLDERS = {"other": "another session", "same": "the same session"}


def _flat_series(results: Results) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(subject, who holds the others, figures by level) of the flatness measure."""
    for key, by_holder in results.get("flatness", {}).items():
        for holder, by_level in by_holder.items():
            yield key, holder, by_level


def _verdict(ok: bool) -> str:
    return "yes" if ok else "**no**"


def plot(results: Results, path: Path) -> None:
    import matplotlib  # noqa: PLC0415  (a bench extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: PLC0415

    colors = dict(
        zip(BACKENDS, ("#336699", "#cc3333", "#339966", "#996633", "#cc8833"), strict=True)
    )
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))

    def bars(ax: Any, measure: str, field: str, title: str, err: str | None = None) -> None:
        keys = [k for k in _ran(results, measure) if _get(results, measure, k, field)]
        values = [_get(results, measure, k, field) for k in keys]
        labels = [f"{BY_KEY[k].label} ({BY_KEY[k].backend})" for k in keys]
        xerr = None
        if err:
            xerr = [
                [0] * len(keys),
                [_get(results, measure, k, err) - v for k, v in zip(keys, values, strict=True)],
            ]
        ax.barh(labels, values, xerr=xerr, color=[colors[BY_KEY[k].backend] for k in keys])
        for label in ax.get_yticklabels():
            if label.get_text().startswith("lockwarden"):
                label.set_fontweight("bold")
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(title)
        ends = xerr[1] if xerr else [0] * len(values)
        for y, (v, extra) in enumerate(zip(values, ends, strict=True)):
            text = f" {v:,.0f}" if v >= 10 else f" {v:.2g}"
            ax.annotate(text, (v + extra, y), va="center", fontsize=8)

    bars(axes[0][0], "uncontended", "pair_us", "uncontended acquire + release, µs (log)")
    bars(axes[0][1], "handoff", "median_ms", "handoff, ms: median, whisker to p99 (log)", "p99_ms")
    bars(axes[1][0], "throughput", "per_second", "4 processes on one lock: acquisitions/s (log)")
    ax = axes[1][1]
    for key, holder, by_level in _flat_series(results):
        ax.plot(
            range(len(by_level)),
            [v["ratio"] for v in by_level.values()],
            marker="o",
            linestyle="-" if holder == "other" else "--",
            color=colors[BY_KEY[key].backend],
            label=f"{BY_KEY[key].backend}, held by {HOLDERS[holder]}",
        )
        ax.set_xticks(range(len(by_level)), [f"{int(x):,}" for x in by_level])
    ax.axhline(FLAT_BOUND, color="grey", linewidth=0.8, linestyle=":")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("other locks held")
    ax.set_title("lockwarden acquire / the empty table's (log)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    meta = results["meta"]
    fig.suptitle(f"lockwarden store benchmark · {meta['date']} · {meta['cpus']} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def breakdown(results: Results) -> dict[str, dict[str, dict[str, float]]]:
    """Each PostgreSQL subject's acquire and release: at the server, and on the client's side.

    "At the server" is the median time the call's exchanges spent beyond the
    round-trip counter (server work, commit flush and one loopback hop); the
    client's side is the rest of the uncontended time (the library's Python,
    the driver, the socket calls).
    """
    parts: dict[str, dict[str, dict[str, float]]] = {}
    for key in _ran(results, "round_trips"):
        calls = {}
        for call in ("acquire", "release"):
            client = _get(results, "uncontended", key, f"{call}_us")
            server = _get(results, "round_trips", key, f"{call}_server_us")
            if client is None or server is None:
                break
            calls[call] = {"client": client, "server": server, "rest": client - server}
        else:
            parts[key] = calls
    return parts
