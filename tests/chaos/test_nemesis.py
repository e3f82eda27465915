"""The nemesis aims its kills and pauses at workers inside a release as at those midway
through their read-modify-write, and its record of a fault says which it hit."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from chaos.config import Config
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
