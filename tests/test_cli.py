"""Bad input at the command line: one line naming the problem, exit 2, nothing on disk lost."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from harness.commands.main import main as tightrope
from harness.records.journal import read_journal
from reference_trainer.checkpoints.run_dir import holds_no_run
from reference_trainer.cli import main as trainer

from .conftest import run_module


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run trained to step 4 with checkpoints at 2 and 4."""
    run_dir = tmp_path_factory.mktemp("runs") / "done"
    args = ["--preset", "tiny", "--steps", "4", "--checkpoint-every", "2", "--run-dir"]
    assert trainer([*args, str(run_dir)]) == 0
    return run_dir


@pytest.fixture
def run_copy(finished_run: Path, tmp_path: Path) -> Path:
    """A private copy of the finished run that a test may damage."""
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single line the command wrote to stderr."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("reference_trainer: error: ") or lines[0].startswith(
        "tightrope: error: "
    )
    return lines[0]


def exit_code(command: Callable[[list[str]], int], argv: list[str]) -> int:
    """What a command-line entry point exits with, whether it returns or raises SystemExit."""
    try:
        return command(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "huge"], "unknown preset 'huge'; choose one of tiny, small"),
        (["--steps", "0"], "argument --steps: expected a positive integer up to 100000000, got 0"),
        (["--steps", "-3"], "--steps: expected a positive integer up to 100000000, got -3"),
        (["--steps", "ten"], "--steps: expected a positive integer up to 100000000, got 'ten'"),
        (["--steps", str(10**12)], "--steps: expected a positive integer up to 100000000"),
        (["--batch-size", str(10**9)], "--batch-size: expected a positive integer up to 65536"),
        (["--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
        (["--steps", "10", "--stop-after", "20"], "--stop-after 20 is past --steps 10"),
        (["--seed", str(2**64)], "--seed 18446744073709551616 is not within 0 to 2^32-1"),
        (["--seed", "-1"], "--seed -1 is not within 0 to 2^32-1"),
        *(
            []
            if torch.cuda.is_available()
            else [(["--device", "cuda"], "--device cuda, but this machine has no CUDA device")]
        ),
        (["--steps", "10", "--fault-plan", "{plan}:empty"], "holds no fault"),
        (["--steps", "10", "--fault-plan", "{plan}:late"], "fires at step 40, past --steps 10"),
        (
            ["--steps", "10", "--fault-plan", "{plan}:rank3"],
            "targets ranks [3], but WORLD_SIZE is 1",
        ),
        (["--steps", "10", "--fault-plan", "{plan}:deep"], "nested more than 64 levels deep"),
    ],
)
def test_bad_arguments_fail_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    run_dir = tmp_path / "new"
    plans = {
        "empty": "faults: []\n",
        "late": "faults:\n  - {kind: nan_grad, at_step: 40}\n",
        "rank3": "faults:\n  - {kind: nan_grad, at_step: 4, ranks: [3]}\n",
        "deep": "[" * 500 + "]" * 500,
    }
    for i, word in enumerate(argv):
        if word.startswith("{plan}:"):
            name = word.split(":", 1)[1]
            (tmp_path / f"{name}.yaml").write_text(plans[name])
            argv = [*argv[:i], str(tmp_path / f"{name}.yaml"), *argv[i + 1 :]]
    assert exit_code(trainer, [*argv, "--run-dir", str(run_dir)]) == 2
    assert message in one_error_line(capsys)
    assert not run_dir.exists()


def test_resume_of_a_run_dir_never_made_starts_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job killed before its start made the run dir, restarted with --resume (#30)."""
    run_dir = tmp_path / "never-made"
    assert trainer(["--run-dir", str(run_dir), "--resume", "--steps", "1"]) == 0
    assert "starting the run over (--resume has nothing to resume)" in capsys.readouterr().err
    assert json.loads((run_dir / "config.json").read_text())["steps"] == 1


def test_every_rank_takes_a_run_dir_not_yet_made_for_one_that_holds_no_run(
    tmp_path: Path,
) -> None:
    # Rank 0 makes a missing run dir as it claims it; rank 1 of the same resumed job may
    # look before that and must also start the run over, not refuse the dir (a two-rank
    # crash point: killed before the run dir was made, resumed; `tightrope crashpoints
    # --ranks 2` found rank 1 exiting "run dir ... does not exist").
    assert holds_no_run(tmp_path / "never-made")
    (tmp_path / "notes.txt").write_text("mine")
    assert not holds_no_run(tmp_path)


def test_resume_of_a_dir_without_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert trainer(["--run-dir", str(tmp_path), "--resume"]) == 2
    assert "holds no run to resume (no config.json)" in one_error_line(capsys)
    assert snapshot(tmp_path) == {"notes.txt": hashlib.sha256(b"mine").hexdigest()}


def test_fresh_run_refuses_a_dir_holding_a_run(
    run_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(run_copy)
    assert trainer(["--run-dir", str(run_copy), "--steps", "8"]) == 2
    assert "already holds a run (checkpoints and journal); pass --resume" in one_error_line(capsys)
    assert snapshot(run_copy) == before


def test_unreadable_checkpoints_are_named_and_nothing_changes(
    run_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for data in (run_copy / "checkpoints").glob("step-*/*.*"):
        if data.suffix in (".pt", ".bin"):
            data.write_bytes(data.read_bytes()[:1000])
    before = snapshot(run_copy)
    assert trainer(["--run-dir", str(run_copy), "--resume", "--steps", "8"]) == 2
    line = one_error_line(capsys)
    assert "none of the 2 checkpoint(s) in" in line
    assert "step-00000004/" in line and "step-00000002/" in line  # each one, with why
    journal = {k: v for k, v in snapshot(run_copy).items() if not k.startswith("journal")}
    assert journal == {k: v for k, v in before.items() if not k.startswith("journal")}


def test_a_run_whose_first_save_was_interrupted_starts_over_on_resume(
    run_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = run_copy / "checkpoints"
    for folder in root.glob("step-*"):
        shutil.rmtree(folder)
    (root / "latest").unlink()
    (root / ".step-00000002.tmp").mkdir()  # the first save, killed mid-way
    (root / ".step-00000002.tmp" / "state.pt").write_bytes(b"\x80\x02partial")
    before = snapshot(run_copy)
    assert trainer(["--run-dir", str(run_copy), "--steps", "4"]) == 2
    line = one_error_line(capsys)
    assert "never finished a checkpoint" in line and "pass --resume to start it over" in line
    assert snapshot(run_copy) == before
    assert trainer(["--run-dir", str(run_copy), "--resume", "--steps", "4"]) == 0
    assert "never finished a checkpoint; starting over from step 0" in capsys.readouterr().out
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000002", "step-00000004"]


def test_resume_takes_the_newest_valid_checkpoint_whatever_latest_says(run_copy: Path) -> None:
    root = run_copy / "checkpoints"
    shutil.rmtree(root / "step-00000004")  # the newest is gone, and latest is a FIFO
    (root / "latest").unlink()
    os.mkfifo(root / "latest")
    assert trainer(["--run-dir", str(run_copy), "--resume", "--steps", "6"]) == 0
    loads = [e for e in read_journal(run_copy) if e.kind == "checkpoint_loaded"]
    assert [Path(e["path"]).name for e in loads] == ["step-00000002"]


def test_resume_refuses_a_changed_configuration(
    run_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(run_copy)
    code = trainer(["--run-dir", str(run_copy), "--resume", "--steps", "8", "--precision", "fp16"])
    assert code == 2
    assert "--precision fp16 differs from the resumed run's fp32" in one_error_line(capsys)
    assert trainer(["--run-dir", str(run_copy), "--resume", "--preset", "small"]) == 2
    assert "--preset small differs from the resumed run's preset tiny" in one_error_line(capsys)
    assert snapshot(run_copy) == before


def test_resume_of_a_finished_run_has_nothing_to_do(
    run_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(run_copy)
    assert trainer(["--run-dir", str(run_copy), "--resume", "--steps", "4"]) == 0
    assert "already at step 4; nothing to do" in capsys.readouterr().out
    assert snapshot(run_copy) == before


def test_resume_continues_to_the_new_target(run_copy: Path) -> None:
    assert trainer(["--run-dir", str(run_copy), "--resume", "--steps", "6"]) == 0
    assert (run_copy / "checkpoints" / "latest").read_text().strip() == "step-00000006"


@pytest.mark.slow
def test_trainer_error_from_a_real_process_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = run_module("-m", "reference_trainer", "--preset", "huge", "--run-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "reference_trainer: error: unknown preset 'huge'; choose one of tiny, small"
    )


def test_tightrope_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(tightrope, ["--help"]) == 0
    assert "summary" in capsys.readouterr().out


def test_tightrope_summary_reads_the_journal(
    finished_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tightrope(["summary", str(finished_run)]) == 0
    out = capsys.readouterr().out
    assert "completed at step 4/4" in out
    assert "2 saved, 0 loaded" in out


def test_tightrope_summary_of_a_dir_without_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tightrope(["summary", str(tmp_path)]) == 2
    assert "no journal in" in one_error_line(capsys)


def test_a_reader_that_goes_away_ends_the_command_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `| head -1` does once it has its line
    with open(write_end, "w", buffering=1) as gone:
        monkeypatch.setattr("sys.stdout", gone)
        assert tightrope(["faults"]) == 141
