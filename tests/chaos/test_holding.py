"""The holding intervals on small made-up histories: an overlap of two holders is seen, a
holder told of its loss stops there, a paused worker is left out, a killed one's interval
ends at its kill, and a partition's cut-short holds are measured against the next grant."""

from __future__ import annotations

from typing import Any

from chaos.check import LATE_TOLERANCE
from tests.chaos.test_check import Story, violations


def hold(
    story: Story,
    process: str,
    name: str,
    mode: str,
    token: int,
    *,
    granted: float,
    stopped: float | None,
    reason: str = "release",
    deadline: float | None = None,
) -> None:
    """A grant of ``name`` to ``process`` at ``granted``, one read, and (unless ``stopped`` is
    None: the worker was killed) a ``stopped`` record then the release."""
    story.acquire(process, [(name, mode)], {name: token}, granted - 0.01, granted)
    story.op(process, "read", granted, granted + 0.01, name=name, token=token, result={"value": 0})
    if stopped is None:
        return
    story.records.append(
        {
            "type": "stopped",
            "time": stopped,
            "process": process,
            "reason": reason,
            "told": reason == "lost",
            "lease_left": 0.0 if reason == "lost" else 1.0,
            "deadline": stopped + 1.0 if deadline is None else deadline,
        }
    )
    story.op(process, "release", stopped, stopped + 0.01, names=[name])


def lost(story: Story, process: str, at: float, deadline: float) -> None:
    """The process's ``on_lost``: the library told it its session was lost."""
    story.records.append(
        {"type": "lost", "time": at, "process": process, "reason": "lease", "deadline": deadline}
    )


def finish(story: Story) -> dict[str, Any]:
    summary: dict[str, Any] = story.final({})
    return summary


def test_two_writers_holding_at_once_are_an_overlap() -> None:
    story = Story()
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=3.0)
    hold(story, "b", "n0", "write", 2, granted=2.5, stopped=2.6)
    summary = finish(story)
    assert violations(summary) == {"holding_overlaps": 1}
    assert not summary["safe"]
    first, second = summary["examples"]["holding_overlaps"][0]
    assert (first["process"], first["held_until"], second["process"]) == ("a", 3.0, "b")
    held = summary["holding"]
    assert (held["holds_overtaken"], held["grants_overtaking"]) == (1, 1)


def test_a_writer_and_a_reader_overlap_two_readers_do_not() -> None:
    story = Story()
    hold(story, "a", "n0", "read", 1, granted=0.1, stopped=3.0)
    hold(story, "b", "n0", "read", 2, granted=1.0, stopped=3.5)
    hold(story, "c", "n1", "read", 3, granted=0.1, stopped=3.0)
    hold(story, "d", "n1", "write", 4, granted=2.0, stopped=2.5)
    assert violations(finish(story)) == {"holding_overlaps": 1}


def test_one_after_the_other_is_no_overlap() -> None:
    story = Story()
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=1.0)
    hold(story, "b", "n0", "write", 2, granted=1.05, stopped=2.0)
    summary = finish(story)
    assert violations(summary) == {}
    assert summary["holding"]["holds"] == 2
    assert summary["holding"]["stopped"] == {"release": 2}


def test_a_holder_told_of_its_loss_holds_until_then_not_until_its_blocked_call_returns() -> None:
    """A worker waiting on a call the partition holds up learns of the loss at 1.9 s and
    sends nothing after: its interval ends there, before the next grant at 2.1 s."""
    story = Story()
    lost(story, "a", at=1.9, deadline=1.899)
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=6.0, reason="unknown")
    hold(story, "b", "n0", "write", 2, granted=2.1, stopped=2.2)
    summary = finish(story)
    assert violations(summary) == {}
    held = summary["holding"]
    assert held["told_while_holding"] == 1
    assert held["after_deadline"] == {"measured": 1, "p50": 0.001, "max": 0.001}
    assert held["held_past_local_deadline"] == 0


def test_an_access_sent_after_the_loss_was_told_extends_the_interval() -> None:
    story = Story()
    lost(story, "a", at=1.9, deadline=1.899)
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=None)
    story.op("a", "write", 2.2, 2.3, name="n0", token=1, value=1)  # the worker's rule broken
    story.op("a", "release", 2.4, 2.5, names=["n0"])
    hold(story, "b", "n0", "write", 2, granted=2.1, stopped=2.15)
    summary = finish(story)
    assert violations(summary) == {"holding_overlaps": 1}
    assert summary["examples"]["holding_overlaps"][0][0]["held_until"] == 2.2


def test_a_paused_holder_is_left_out() -> None:
    """Frozen by SIGSTOP from 0.5 s to 4.5 s, it could not stop itself: fencing's case."""
    story = Story()
    story.process("a", pid=7)
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=4.6, reason="refused")
    story.records += [
        {"type": "fault", "time": 0.5, "fault": "pause", "pid": 7, "slot": 0},
        {"type": "fault", "time": 4.5, "fault": "resume", "pid": 7, "slot": 0},
    ]
    hold(story, "b", "n0", "write", 2, granted=2.5, stopped=2.6)
    summary = finish(story)
    assert violations(summary) == {}
    assert summary["holding"]["paused_left_out"] == 1
    assert summary["holding"]["holds"] == 1


def test_a_pause_of_another_worker_leaves_the_holder_in() -> None:
    story = Story()
    story.process("a", pid=7)
    story.process("c", pid=8)
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=4.6)
    story.records += [
        {"type": "fault", "time": 0.5, "fault": "pause", "pid": 8, "slot": 1},
        {"type": "fault", "time": 4.5, "fault": "resume", "pid": 8, "slot": 1},
    ]
    hold(story, "b", "n0", "write", 2, granted=2.5, stopped=2.6)
    assert violations(finish(story)) == {"holding_overlaps": 1}


def test_a_killed_holders_interval_ends_at_its_kill() -> None:
    story = Story()
    story.process("a", pid=7)
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=None)
    story.fault("kill", 1.0, pid=7)
    hold(story, "b", "n0", "write", 2, granted=1.5, stopped=1.6)
    assert violations(finish(story)) == {}
    # ...and not earlier: a grant before the kill overlaps the killed holder.
    story = Story()
    story.process("a", pid=7)
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=None)
    story.fault("kill", 3.0, pid=7)
    hold(story, "b", "n0", "write", 2, granted=2.5, stopped=2.6)
    summary = finish(story)
    assert violations(summary) == {"holding_overlaps": 1}
    assert summary["examples"]["holding_overlaps"][0][0]["held_until"] == 3.0


def test_a_stop_after_the_local_deadline_is_counted_not_judged() -> None:
    """Late by more than the tolerance: an observation; beyond the whole margin (a tenth of
    the TTL) counted apart. Nobody took the name meanwhile, so no violation."""
    story = Story(ttl=2.0)
    lost(story, "a", at=2.0, deadline=2.0 - 2 * LATE_TOLERANCE)
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=2.01, reason="lost")
    lost(story, "b", at=5.5, deadline=5.0)
    hold(story, "b", "n1", "write", 2, granted=3.0, stopped=5.6, reason="lost")
    summary = finish(story)
    assert violations(summary) == {}
    held = summary["holding"]
    assert (held["held_past_local_deadline"], held["beyond_margin"]) == (2, 1)
    assert held["after_deadline"]["max"] == 0.5
    assert held["stopped"] == {"lost": 2}


def test_holds_cut_short_by_a_partition_are_measured_against_the_next_grant() -> None:
    story = Story()
    story.records.append({"type": "process", "time": 0.0, "process": "a", "pid": 7, "slot": 0})
    story.records.append(
        {"type": "fault", "time": 0.5, "fault": "partition", "slot": 0, "pid": 7, "slots": [0]}
    )
    lost(story, "a", at=1.9, deadline=1.899)
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=1.9, reason="lost")
    hold(story, "b", "n0", "read", 2, granted=2.2, stopped=2.3)
    story.records.append({"type": "fault", "time": 5.0, "fault": "heal", "slot": 0, "slots": [0]})
    summary = finish(story)
    held = summary["holding"]
    assert violations(summary) == {}
    assert (held["partitions"], held["cut_short_by_partition"]) == (1, 1)
    assert held["lead_over_next_grant"] == {"measured": 1, "min": 0.3, "p50": 0.3}


def test_a_partition_of_one_holder_is_a_death_and_the_takers_partition_is_not_measured() -> None:
    """Cut off alone, a write holder is dead to the others: the next grant measures the
    recovery. A taker cut off itself (every worker at once) would measure its partition."""
    story = Story(ttl=2.0)
    story.records.append({"type": "process", "time": 0.0, "process": "a", "pid": 7, "slot": 0})
    story.records.append({"type": "process", "time": 0.0, "process": "b", "pid": 8, "slot": 1})
    hold(story, "a", "n0", "write", 1, granted=0.1, stopped=None)
    story.records.append(
        {"type": "fault", "time": 1.0, "fault": "partition", "slot": 0, "pid": 7, "slots": [0]}
    )
    story.acquire("b", [("n0", "write")], {"n0": 2}, 1.5, 2.8)
    story.records.append({"type": "fault", "time": 4.0, "fault": "heal", "slot": 0, "slots": [0]})
    hold(story, "a", "n1", "write", 3, granted=5.0, stopped=None)
    story.records.append(
        {"type": "fault", "time": 6.0, "fault": "partition", "slot": None, "slots": [0, 1]}
    )
    story.fault("kill", 6.5, pid=7)
    story.acquire("b", [("n1", "write")], {"n1": 4}, 7.0, 9.0)
    story.records.append({"type": "fault", "time": 9.5, "fault": "heal", "slots": [0, 1]})
    live = finish(story)["liveness"]
    assert (live["recoveries"], live["max"], live["partitioned"]) == (1, 1.8, 1)


def test_a_grant_made_while_its_worker_was_paused_is_left_out_and_counted() -> None:
    """Frozen while it waited, the worker was handed the lock meanwhile; it thaws after its
    lease ran out, and its acquire returns before the library says so: fencing's case."""
    story = Story()
    story.process("a", pid=7)
    story.acquire("a", [("n0", "write")], {"n0": 1}, 0.0, 4.51)
    story.records += [
        {"type": "fault", "time": 0.5, "fault": "pause", "pid": 7, "slot": 0},
        {"type": "fault", "time": 4.5, "fault": "resume", "pid": 7, "slot": 0},
    ]
    story.op("a", "read", 4.511, 4.52, "fail", name="n0", token=1)
    lost(story, "a", at=4.515, deadline=1.8)
    hold(story, "b", "n0", "write", 2, granted=2.5, stopped=4.6)
    summary = finish(story)
    assert violations(summary) == {}
    held = summary["holding"]
    assert (held["paused_left_out"], held["granted_past_deadline"]) == (1, 1)
    (example,) = held["granted_past_deadline_examples"]
    assert (example["granted"], example["deadline"], example["paused"]) == (4.51, 1.8, True)
