"""The harness's command line refuses settings that cannot make a run, before starting one."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.__main__ import main


@pytest.mark.parametrize("option", ["--hold", "--think"])
def test_a_negative_sleep_is_refused(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "h.jsonl"
    with pytest.raises(SystemExit) as exit_:
        main(["--backend", "sqlite", option, "-0.1", "--history", str(history)])
    assert exit_.value.code == 2
    assert "--hold and --think are sleeps" in capsys.readouterr().err
    assert not history.exists()


def test_the_control_run_of_the_local_deadline_needs_partitions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "h.jsonl"
    for argv in (
        ["--backend", "sqlite", "--no-local-deadline"],
        ["--backend", "postgres", "--no-local-deadline", "--no-partitions"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--history", str(history)])
        assert exit_.value.code == 2
        assert "--no-local-deadline) needs partitions" in capsys.readouterr().err
    assert not history.exists()
