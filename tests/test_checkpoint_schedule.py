"""Checkpoints every N trained tokens: which steps save, the flag, and its conflicts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from reference_trainer.checkpoints.schedule import SaveSchedule, token_count
from reference_trainer.cli import main as trainer
from reference_trainer.config import TrainConfig, preset
from reference_trainer.errors import ConfigError


def saves(schedule: SaveSchedule, tokens: list[int]) -> list[int]:
    return [step for step, n in enumerate(tokens, 1) if schedule.after_step(step, n)]


def test_a_token_schedule_saves_at_the_first_step_at_or_after_each_multiple() -> None:
    # cumulative: 400 800 1200 1500 1900 2300 3400 3500
    tokens = [400, 400, 400, 300, 400, 400, 1100, 100]
    assert saves(SaveSchedule(every_steps=2, every_tokens=1000), tokens) == [3, 6, 7]
    # One step that crosses two multiples saves once.
    assert saves(SaveSchedule(every_steps=2, every_tokens=500), [400, 1200, 100]) == [2]


def test_without_a_token_count_it_saves_every_n_steps() -> None:
    assert saves(SaveSchedule(every_steps=3, every_tokens=0), [512] * 10) == [3, 6, 9]


def test_a_resumed_schedule_counts_on_from_the_saved_count() -> None:
    straight = SaveSchedule(every_steps=1, every_tokens=1000)
    expected = saves(straight, [300] * 10)
    resumed = SaveSchedule(every_steps=1, every_tokens=1000, tokens=4 * 300)
    assert [s + 4 for s in saves(resumed, [300] * 6)] == [s for s in expected if s > 4]
    # Negative control: a count that restarts at zero saves at other steps.
    restarted = SaveSchedule(every_steps=1, every_tokens=1000)
    assert [s + 4 for s in saves(restarted, [300] * 6)] != [s for s in expected if s > 4]


@pytest.mark.parametrize(("text", "value"), [("2M", 2_000_000), ("500k", 500_000), ("77", 77)])
def test_token_counts_read_with_a_suffix(text: str, value: int) -> None:
    assert token_count(text) == value


@pytest.mark.parametrize("text", ["0", "-5", "2.5M", "two", "3T", ""])
def test_bad_token_counts_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a positive token count"):
        token_count(text)


def test_a_negative_config_count_is_refused_naming_the_field() -> None:
    data = preset("tiny").to_dict() | {"checkpoint_every_tokens": -1}
    with pytest.raises(ConfigError, match="checkpoint_every_tokens must be an integer >= 0"):
        TrainConfig.from_dict(data)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--checkpoint-every", "5", "--checkpoint-every-tokens", "2M"],
            "--checkpoint-every and --checkpoint-every-tokens are two schedules; give one",
        ),
        (["--checkpoint-every-tokens", "lots"], "expected a positive token count"),
        (
            ["--enable", "dynamic_batching", "--batch-size", "0"],
            "--batch-size: expected a positive integer",
        ),
    ],
)
def test_conflicting_or_bad_flags_fail_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    run_dir = tmp_path / "new"
    try:
        code = trainer([*argv, "--run-dir", str(run_dir)])
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not run_dir.exists()


def test_due_tells_a_save_step_without_counting_it() -> None:
    # The replica check asks before the step's save whether there will be one.
    schedule = SaveSchedule(10, 1000)
    answers = []
    for step in range(1, 8):
        asked = schedule.due(step, 300)
        assert schedule.due(step, 300) == asked  # asking twice counts nothing
        answers.append((asked, schedule.after_step(step, 300)))
    assert all(asked == saved for asked, saved in answers)
    assert [saved for _, saved in answers] == [False, False, False, True, False, False, True]
