"""`tightrope summary` on hand-built journals: the verdict a user reads first must be true."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.commands.main import main as tightrope
from harness.records.journal import JournalWriter, read_journal
from harness.records.summary import summarize

TARGET = 80


def start(w: JournalWriter, step: int = 0, world_size: int = 1) -> None:
    """A ``run_start`` at ``step`` (0 for a fresh run, the checkpoint's step on a resume)."""
    w.emit("run_start", step, world_size=world_size, pid=1, host="h", target_steps=TARGET)


def train(w: JournalWriter, first: int, last: int, **fields: object) -> None:
    """Step events ``first..last`` with a falling loss, plus ``fields`` on each."""
    for step in range(first, last + 1):
        w.emit("step", step, loss=4.0 / step, tokens=256, step_time=0.01, **fields)


def verdict(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The lines `tightrope summary` printed; the first is the verdict."""
    assert tightrope(["summary", str(run_dir)]) == 0
    return [line.strip() for line in capsys.readouterr().out.splitlines()]


def test_a_first_loss_of_zero_gives_no_ratio_and_no_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with JournalWriter(tmp_path) as w:
        start(w)
        w.emit("step", 1, loss=0.0, tokens=256, step_time=0.0)
        w.emit("step", 2, loss=1.5, tokens=256, step_time=0.0, params_finite=True)
        w.emit("run_end", 2, status="completed")
    lines = verdict(tmp_path, capsys)
    assert lines[0] == "verdict: completed step 2 of 80, weights finite"
    assert "no ratio: the first step's loss (step 1) is 0" in lines
    assert not any("tokens/s" in line for line in lines)  # a step time of 0 gives no rate
    assert summarize(read_journal(tmp_path)).loss_ratio() is None


def test_a_nan_last_loss_gives_no_ratio(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        start(w)
        train(w, 1, 3)
        w.emit("step", 4, loss=math.nan, skipped=True)
    result = summarize(read_journal(tmp_path))
    assert result.loss_ratio() is None
    assert result.loss_change() == "no ratio: the last step's loss (step 4) is nan"


def test_nan_weights_are_not_called_completed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with JournalWriter(tmp_path) as w:
        start(w)
        for step in range(1, TARGET + 1):
            observed = {"params_finite": step <= 30} if step % 10 == 0 or step == 31 else {}
            loss = 4.0 / step if step <= 30 else math.nan
            w.emit("step", step, loss=loss, **observed)
        w.emit("run_end", TARGET, status="completed")
    lines = verdict(tmp_path, capsys)
    assert lines[0] == "verdict: NaN weights at step 31"
    assert "status     completed at step 80/80" in lines  # the trainer's word, shown as such


def test_a_nan_final_loss_that_was_applied_means_nan_weights(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        start(w)
        train(w, 1, 10)
        for step in (11, 12):
            w.emit("step", step, loss=math.inf)  # updates applied: no params_finite, no skip
        w.emit("run_end", 12, status="completed")
    assert summarize(read_journal(tmp_path)).verdict() == "NaN weights at step 11"


def test_a_skipped_nan_step_keeps_the_weights_finite(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        start(w)
        train(w, 1, 9)
        w.emit("step", 10, loss=math.nan, skipped=True, params_finite=True)
        w.emit("run_end", 10, status="completed")
    assert summarize(read_journal(tmp_path)).verdict() == "completed step 10 of 80, weights finite"


def test_a_rollback_after_nan_weights_ends_finite(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        start(w)
        train(w, 1, 30)
        w.emit("step", 31, loss=math.nan, params_finite=False)
        w.emit("checkpoint_loaded", 30, path="checkpoints/step-00000030")
        train(w, 31, 40, params_finite=True)
        w.emit("run_end", 40, status="completed")
    result = summarize(read_journal(tmp_path))
    assert result.nonfinite_since is None
    assert result.steps_redone == 1  # step 31 was done twice, on one attempt
    assert result.verdict() == "completed step 40 of 80, weights finite"


def test_restarts_are_counted_with_the_steps_they_redid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Attempt 0 reaches 33 and is killed; attempt 1 resumes from 30 and is killed at 36;
    # attempt 2 resumes from 33 and completes. Rank 1 journals alike.
    for rank in (0, 1):
        with JournalWriter(tmp_path, rank=rank, restart=0) as w:
            start(w, world_size=2)
            train(w, 1, 33)
    for restart, (resume, killed_at) in enumerate([(30, 36), (33, None)], start=1):
        for rank in (0, 1):
            with JournalWriter(tmp_path, rank=rank, restart=restart) as w:
                start(w, resume, world_size=2)
                w.emit("restart", resume, count=restart)
                w.emit("checkpoint_loaded", resume, path=f"checkpoints/step-{resume:08d}")
                train(w, resume + 1, killed_at or TARGET, params_finite=True)
                if killed_at is None:
                    w.emit("run_end", TARGET, status="completed")
    result = summarize(read_journal(tmp_path))
    assert (result.restarts, result.attempts, result.steps, result.steps_redone) == (2, 3, 80, 6)
    lines = verdict(tmp_path, capsys)
    expected = "verdict: completed step 80 of 80, 2 restarts, 6 steps redone, weights finite"
    assert lines[0] == expected
    assert "attempts   3, highest step 80, 6 steps redone" in lines
    assert "checkpts   0 saved, 2 loaded" in lines  # rank 0's loads only


def test_a_killed_last_attempt_reports_where_it_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with JournalWriter(tmp_path, restart=0) as w:
        start(w)
        train(w, 1, 40)
        w.emit("run_end", 40, status="failed", reason="RuntimeError: rank 1 lost")
    with JournalWriter(tmp_path, restart=1) as w:
        start(w, 30)
        train(w, 31, 35)
    result = summarize(read_journal(tmp_path))
    assert (result.steps, result.end_step, result.status) == (40, 35, None)
    lines = verdict(tmp_path, capsys)
    assert lines[0] == "verdict: stopped at step 35 (killed: no run_end), 1 restart, 5 steps redone"
    assert "status     no run_end (killed or still running) at step 35/80" in lines


def test_a_run_killed_without_restarts(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        start(w)
        train(w, 1, 40)
    assert summarize(read_journal(tmp_path)).verdict() == "stopped at step 40 (killed: no run_end)"


def test_a_failed_run_names_its_reason(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        start(w)
        train(w, 1, 12)
        w.emit("run_end", 12, status="failed", reason="recovery exhausted")
    assert summarize(read_journal(tmp_path)).verdict() == "failed at step 12 (recovery exhausted)"
