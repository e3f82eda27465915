"""The nemesis aims its kills and pauses at workers inside a release as at those midway
through their read-modify-write, and its record of a fault says which it hit; a partition
freezes one worker's proxies (mostly a holder's) or every worker's, and heals them."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from chaos import nemesis as nemesis_module
from chaos.config import Config
from chaos.history import HistoryWriter, load_history
from chaos.nemesis import Nemesis
from chaos.worker import Board


class _Running:
    """Three workers, all running (pids 100, 101, 102)."""

    def pid(self, slot: int) -> int | None:
        return 100 + slot

    def kill(self, slot: int) -> int | None:
        raise AssertionError("nothing is killed here")


def test_a_worker_inside_its_release_is_aimed_at_and_named(tmp_path: Path) -> None:
    board = Board(str(tmp_path / "board"), 3)
    config = Config(
        backend="sqlite",
        url=f"sqlite:///{tmp_path / 'store.db'}",
        run_id="aim",
        seed=7,
        duration=1.0,
        history=str(tmp_path / "history.jsonl"),
        board=str(tmp_path / "board"),
        workers=3,
    )
    nemesis = Nemesis(config, _Running(), board, history=None)  # type: ignore[arg-type]
    board.set(0, Board.IDLE)
    board.set(1, Board.RELEASING)
    board.set(2, Board.HOLDING)
    picked = Counter(victim[0] for _ in range(300) if (victim := nemesis._victim()))
    # Aimed (0.8) at the releasing worker before a merely holding one; else any of three.
    assert picked[1] > 200 and picked[2] < 60
    assert [nemesis._state(slot) for slot in range(3)] == ["idle", "releasing", "holding"]


class _Network:
    """The workers' proxies, as the nemesis sees them: what was frozen and thawed, when."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], float]] = []

    def freeze(self, slots: Iterable[int]) -> None:
        self.calls.append(("freeze", list(slots), time.monotonic()))

    def thaw(self, slots: Iterable[int]) -> None:
        self.calls.append(("thaw", list(slots), time.monotonic()))


def _partitioning(tmp_path: Path, backend: str = "postgres") -> tuple[Nemesis, Board, _Network]:
    board = Board(str(tmp_path / "board"), 3)
    config = Config(
        backend=backend,
        url="postgresql://postgres@127.0.0.1:5432/test",
        run_id="cut",
        seed=7,
        duration=1.0,
        history=str(tmp_path / "history.jsonl"),
        board=str(tmp_path / "board"),
        workers=3,
        ttl=0.05,  # partitions of 0.05 to 0.15 s
    )
    network = _Network()
    history = HistoryWriter(tmp_path / "history.jsonl")
    return Nemesis(config, _Running(), board, history, network=network), board, network


def _faults(tmp_path: Path) -> list[dict[str, Any]]:
    records, _ = load_history(tmp_path / "history.jsonl")
    return [r for r in records if r["type"] == "fault"]


def test_a_partition_freezes_one_holders_proxies_then_heals_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nemesis_module, "PARTITION_ALL", 0.0)
    nemesis, board, network = _partitioning(tmp_path)
    board.set(0, Board.IDLE)
    board.set(1, Board.IDLE)
    board.set(2, Board.MIDWAY)
    for _ in range(5):
        nemesis.partition()
    freezes = [slots for call, slots, _ in network.calls if call == "freeze"]
    assert [call for call, _, _ in network.calls] == ["freeze", "thaw"] * 5
    assert all(len(slots) == 1 for slots in freezes)
    assert freezes.count([2]) >= 3  # aimed (0.8) at the worker midway through its write
    cut, healed = _faults(tmp_path)[:2]
    assert (cut["fault"], healed["fault"]) == ("partition", "heal")
    assert cut["slots"] == healed["slots"] == [cut["slot"]]
    assert cut["pid"] == 100 + cut["slot"]
    assert 0.05 <= cut["seconds"] <= 0.15
    assert healed["time"] - cut["time"] >= cut["seconds"]
    frozen_at, thawed_at = network.calls[0][2], network.calls[1][2]
    assert thawed_at - frozen_at >= cut["seconds"]


def test_a_partition_of_every_worker_at_once_heals_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nemesis_module, "PARTITION_ALL", 1.0)
    nemesis, _, network = _partitioning(tmp_path)
    nemesis.partition()
    assert [(call, slots) for call, slots, _ in network.calls] == [
        ("freeze", [0, 1, 2]),
        ("thaw", [0, 1, 2]),
    ]
    cut, healed = _faults(tmp_path)
    assert (cut["slot"], cut["slots"], healed["slots"]) == (None, [0, 1, 2], [0, 1, 2])


def test_a_nemesis_stopped_during_a_partition_heals_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nemesis_module, "PARTITION_TTLS", (100.0, 100.0))  # 5 s
    nemesis, _, network = _partitioning(tmp_path)
    threading.Timer(0.1, nemesis.stopping.set).start()
    began = time.monotonic()
    nemesis.partition()
    assert time.monotonic() - began < 2.0
    assert [call for call, _, _ in network.calls] == ["freeze", "thaw"]
    assert [f["fault"] for f in _faults(tmp_path)] == ["partition", "heal"]


def test_partitions_come_twice_as_often_as_each_other_fault_and_never_on_sqlite(
    tmp_path: Path,
) -> None:
    nemesis, _, _ = _partitioning(tmp_path)
    assert sorted(nemesis._menu) == ["kill", "partition", "partition", "pause", "terminate"]
    picked = Counter(nemesis.rng.choice(nemesis._menu) for _ in range(5000))
    assert 1.7 < picked["partition"] / picked["kill"] < 2.3
    board = Board(str(tmp_path / "board"), 3)
    config = Config(
        backend="sqlite",
        url=f"sqlite:///{tmp_path / 'store.db'}",
        run_id="lite",
        seed=7,
        duration=1.0,
        history=str(tmp_path / "history.jsonl"),
        board=str(tmp_path / "board"),
        workers=3,
    )
    lite = Nemesis(config, _Running(), board, history=None)  # type: ignore[arg-type]
    assert lite._menu == ["kill", "kill-writer", "pause"]  # as before: the same choices
