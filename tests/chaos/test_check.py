"""The checker on small made-up histories: each violation is seen, a clean history passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos.check import check_file, parse, summarize
from chaos.history import HistoryWriter, Record


class Story:
    """Builds a history the way the workers, the nemesis and the controller write one."""

    def __init__(self, ttl: float = 2.0) -> None:
        self.records: list[Record] = [
            {"type": "run", "time": 0.0, "config": {"ttl": ttl, "fencing": True}}
        ]
        self._ops: dict[str, int] = {}

    def process(self, process: str, pid: int, at: float = 0.0) -> None:
        self.records.append({"type": "process", "time": at, "process": process, "pid": pid})

    def op(
        self, process: str, f: str, t0: float, t1: float | None, end: str = "ok", **fields: Any
    ) -> None:
        """One operation; ``t1`` None: no completion (the process died). Fields named
        ``result`` go to the completion, the others to the invocation."""
        self._ops[process] = n = self._ops.get(process, 0) + 1
        result = fields.pop("result", {})
        head = {"process": process, "op": n, "f": f}
        self.records.append({"type": "invoke", "time": t0, **head, **fields})
        if t1 is not None:
            self.records.append({"type": end, "time": t1, **head, **result})

    def increment(
        self, process: str, name: str, token: int, seen: int, at: float, *, gap: float = 0.01
    ) -> None:
        """A whole critical section: acquire, read ``seen``, write ``seen + 1``, release."""
        self.acquire(process, [(name, "write")], {name: token}, at, at + gap)
        t = [at + k * gap for k in range(8)]
        self.op(process, "read", t[2], t[3], name=name, token=token, result={"value": seen})
        self.op(process, "write", t[4], t[5], name=name, token=token, value=seen + 1)
        self.op(process, "release", t[6], t[7], names=[name])

    def acquire(
        self,
        process: str,
        locks: list[tuple[str, str]],
        tokens: dict[str, int],
        t0: float,
        t1: float,
    ) -> None:
        self.op(process, "acquire", t0, t1, locks=locks, result={"tokens": tokens})

    def fault(self, kind: str, at: float, pid: int) -> None:
        self.records.append({"type": "fault", "time": at, "fault": kind, "pid": pid})

    def final(self, registers: dict[str, int], locks: list[Any] | None = None) -> dict[str, Any]:
        end = {"type": "end", "time": 1000.0}
        final = {"type": "final", "time": 1001.0, "registers": registers, "locks": locks or []}
        self.records += [end, final | {"waiters": [], "cleaned": {}}]
        summary: dict[str, Any] = summarize(parse(self.records))
        return summary


def violations(summary: dict[str, Any]) -> dict[str, int]:
    return {kind: n for kind, n in summary["violations"].items() if n}


def test_a_clean_history_passes() -> None:
    story = Story()
    for i, process in enumerate(["a", "b", "c"]):
        story.process(process, pid=i)
        story.increment(process, "n0", token=10 + i, seen=i, at=i)
    summary = story.final({"n0": 3})
    assert violations(summary) == {}
    assert summary["safe"] and summary["valid"]
    assert summary["registers"] == {"n0": {"final": 3, "accepted": 3, "unknown": 0}}
    assert summary["operations"]["write"] == {"ok": 3}


def test_two_accepted_writes_that_surely_overlapped_are_seen() -> None:
    story = Story()
    story.increment("a", "n0", token=1, seen=0, at=0.0, gap=0.1)  # reads done by 0.3, writes 0.4
    story.increment("b", "n0", token=2, seen=0, at=0.05, gap=0.1)  # reads done by 0.35
    summary = story.final({"n0": 1})
    assert violations(summary) == {
        "overlapping_accepted_writes": 1,
        "lost_increments": 1,
        "holding_overlaps": 1,  # and the two held the lock at once
    }
    assert not summary["safe"]


def test_a_write_whose_completion_came_late_is_not_an_overlap() -> None:
    """The first write was sent before the second read completed: it may have landed first."""
    story = Story()
    story.process("a", pid=7)
    story.acquire("a", [("n0", "write")], {"n0": 1}, 0.0, 0.1)
    story.op("a", "read", 0.2, 0.3, name="n0", token=1, result={"value": 0})
    story.op("a", "write", 0.4, 5.0, name="n0", token=1, value=1)  # paused after sending
    story.fault("pause", 0.45, pid=7)
    story.fault("resume", 4.9, pid=7)
    story.increment("b", "n0", token=2, seen=1, at=1.0)
    summary = story.final({"n0": 2})
    assert violations(summary) == {}


def test_a_later_write_with_an_older_token_is_seen() -> None:
    story = Story()
    story.acquire("old", [("n0", "write")], {"n0": 1}, 0.0, 0.1)
    story.op("old", "read", 0.2, 0.3, name="n0", token=1, result={"value": 0})
    story.increment("new", "n0", token=2, seen=0, at=0.05)  # taken over, written by 0.11
    story.op("old", "write", 5.0, 5.1, name="n0", token=1, value=1)  # the thawed holder writes
    summary = story.final({"n0": 1})
    assert violations(summary)["token_order"] == 1
    assert violations(summary)["lost_increments"] == 1


def test_a_grant_with_an_older_token_after_a_newer_one_is_seen() -> None:
    story = Story()
    story.acquire("a", [("n0", "read")], {"n0": 5}, 0.0, 0.1)
    story.acquire("b", [("n0", "read")], {"n0": 4}, 0.2, 0.3)
    assert violations(story.final({})) == {"grant_order": 1}


@pytest.mark.parametrize(
    ("final", "expected"),
    [
        (2, {"lost_increments": 1}),
        (3, {}),
        (5, {"unexplained_increments": 2}),
    ],
)
def test_the_register_must_count_the_accepted_writes(final: int, expected: dict[str, int]) -> None:
    story = Story()
    for i in range(3):
        story.increment(f"p{i}", "n0", token=i + 1, seen=i, at=i)
    assert violations(story.final({"n0": final})) == expected


def test_a_write_of_unknown_outcome_may_or_may_not_count() -> None:
    """A worker killed after sending its write: the register may hold it or not."""
    story = Story()
    story.process("a", pid=7)
    story.increment("a", "n0", token=1, seen=0, at=0.0)
    story.acquire("a", [("n0", "write")], {"n0": 2}, 1.0, 1.1)
    story.op("a", "read", 1.2, 1.3, name="n0", token=2, result={"value": 1})
    story.op("a", "write", 1.4, None, name="n0", token=2, value=2)  # no completion
    story.fault("kill", 1.5, pid=7)
    story.acquire("b", [("n0", "read")], {"n0": 3}, 2.0, 3.6)
    for at in (3.7, 3.9):  # a reader may see the unknown write, consistently
        story.op("b", "read", at, at + 0.1, name="n0", token=3, result={"value": 2})
    for final in (1, 2):
        copy = Story()
        copy.records = list(story.records)
        summary = copy.final({"n0": final})
        assert violations(summary) == {}, final
        assert summary["registers"]["n0"] == {"final": final, "accepted": 1, "unknown": 1}
    assert violations(story.final({"n0": 3})) == {"unexplained_increments": 1}


def test_a_reader_that_sees_the_register_change_is_seen() -> None:
    story = Story()
    story.increment("w", "n0", token=1, seen=0, at=0.0)
    story.acquire("r", [("n0", "read")], {"n0": 2}, 1.0, 1.1)
    story.op("r", "read", 1.2, 1.3, name="n0", token=2, result={"value": 1})
    story.op("r", "read", 1.6, 1.7, name="n0", token=2, result={"value": 2})
    story.increment("w2", "n0", token=3, seen=1, at=1.35)
    assert violations(story.final({"n0": 2})) == {
        "read_write_exclusion": 1,
        "holding_overlaps": 1,  # the writer came while the reader held
    }


def test_a_reader_that_misses_an_older_write_is_seen() -> None:
    story = Story()
    story.acquire("r", [("n0", "read")], {"n0": 5}, 1.0, 1.1)
    for at in (1.2, 1.4):
        story.op("r", "read", at, at + 0.1, name="n0", token=5, result={"value": 0})
    story.process("w", pid=7)
    story.acquire("w", [("n0", "write")], {"n0": 4}, 0.0, 0.1)  # paused, then wrote anyway
    story.op("w", "read", 0.2, 0.3, name="n0", token=4, result={"value": 0})
    story.fault("pause", 0.35, pid=7)
    story.fault("resume", 1.55, pid=7)
    story.op("w", "write", 1.6, 1.7, name="n0", token=4, value=1)
    assert violations(story.final({"n0": 1})) == {"read_write_exclusion": 1}


def test_a_multi_lock_granted_or_refused_in_part_is_seen() -> None:
    story = Story()
    story.acquire("a", [("n0", "write"), ("n1", "write")], {"n0": 1}, 0.0, 0.1)
    story.op("b", "acquire", 0.0, 0.2, "fail", locks=[["n0", "write"], ["n1", "read"]])
    story.op("b", "held", 0.3, 0.4, names=["n0", "n1"], result={"held": ["n1"]})
    story.op("c", "held", 0.3, 0.4, names=["n0", "n1"], result={"held": []})
    # A look while a release is still retried in the background proves nothing: the
    # refused request's clean-up may be that release.
    story.op("d", "held", 0.3, 0.4, names=["n0", "n1"], result={"held": ["n0"], "releasing": 1})
    story.op("e", "held", 0.3, 0.4, names=["n0", "n1"], result={"held": ["n0"], "releasing": 0})
    assert violations(story.final({})) == {"partial_multi_locks": 3}


def test_locks_left_after_clean_are_seen() -> None:
    summary = Story().final({}, locks=[["n0", "X", 7, "session"]])
    assert violations(summary) == {"locks_after_clean": 1}


def refused(story: Story, process: str, mode: str, token: int, newer: tuple[str, int]) -> None:
    """A holder turned away by the register, a newer grant, then a check that still passes."""
    story.acquire(process, [("n0", mode)], {"n0": token}, 0.0, 0.1)
    story.op(process, "read", 0.5, 0.6, "fail", name="n0", token=token)
    story.acquire("other", [("n0", newer[0])], {"n0": newer[1]}, 0.2, 0.3)
    story.op(process, "check", 0.7, 0.8, names=["n0"])


def test_a_refused_writer_the_store_still_counted_as_holder_is_seen() -> None:
    story = Story()
    refused(story, "w", "write", token=5, newer=("read", 6))
    assert violations(story.final({})) == {"refused_live_holders": 1, "holding_overlaps": 1}


def test_a_refused_reader_overtaken_only_by_readers_is_a_false_refusal() -> None:
    story = Story()
    refused(story, "r", "read", token=5, newer=("read", 6))
    summary = story.final({})
    assert violations(summary) == {}
    assert summary["observations"]["false_refusals"] == 1


def liveness_after_death(mode: str, fault: str, asked: float, granted: float) -> dict[str, Any]:
    """A holder of n0 in ``mode`` dies at 10 s; another process asks for n0 at ``asked``
    and gets it at ``granted``; a third takes n1 meanwhile (never a recovery)."""
    story = Story(ttl=2.0)
    story.process("a", pid=7)
    story.acquire("a", [("n0", mode)], {"n0": 1}, 0.0, 0.1)
    story.fault(fault, 10.0, pid=7)
    story.acquire("b", [("n0", "write")], {"n0": 2}, asked, granted)
    story.acquire("c", [("n1", "read")], {"n1": 3}, 10.5, 10.6)
    live: dict[str, Any] = story.final({})["liveness"]
    return live


def test_recovery_after_a_dead_holder_is_measured_against_the_ttl() -> None:
    live = liveness_after_death("write", "kill", asked=10.5, granted=11.8)  # waited for the lease
    assert (live["recoveries"], live["p50"], live["max"], live["max_in_ttls"]) == (1, 1.8, 1.8, 0.9)


def test_a_death_nobody_was_waiting_for_is_not_measured() -> None:
    live = liveness_after_death("write", "pause", asked=30.0, granted=30.1)  # asked long after
    assert (live["recoveries"], live["unmeasured"]) == (0, 1)


def test_a_dead_reader_is_not_measured() -> None:
    """Live readers of the name (one of them paused, say) would count against it."""
    live = liveness_after_death("read", "kill", asked=10.5, granted=14.0)
    assert live["recoveries"] == 0


def test_a_run_without_its_end_or_with_a_crashed_worker_is_not_valid() -> None:
    story = Story()
    story.records.append({"type": "crash", "time": 1.0, "slot": 0, "pid": 3, "returncode": 1})
    assert not story.final({})["valid"]
    assert not summarize(parse(Story().records))["valid"]


def test_a_torn_last_line_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path)
    writer.write("run", config={"ttl": 2.0})
    writer.write("final", registers={}, locks=[], waiters=[])
    writer.close()
    with open(path, "a") as file:
        file.write('{"type": "invo')
    summary = check_file(path)
    assert summary["history"]["unparsed_lines"] == 1
    assert (tmp_path / "history.summary.json").exists()


def test_a_process_that_hangs_shows_as_the_longest_silence() -> None:
    story = Story()
    story.increment("quick", "n0", token=1, seen=0, at=0.0)
    story.acquire("stuck", [("n1", "write")], {"n1": 2}, 1.0, 31.0)
    silence = story.final({"n0": 1})["liveness"]["longest_silence"]
    assert silence == {"seconds": 30.0, "process": "stuck"}
