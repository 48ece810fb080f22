"""One owner per run dir: a second trainer on a live run dir is refused, naming the holder's
pid; the claim dies with its holder, so a SIGKILLed run can be resumed at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from harness.running.run_lock import OWNER_ENV, RunDirClaimError, RunDirLock
from reference_trainer.checkpoints.files import checkpoint_step, complete_checkpoints

from .conftest import ROOT, run_module

TINY = ("--preset", "tiny", "--checkpoint-every", "5")


def test_a_second_claim_is_refused_naming_the_holder_and_free_once_released(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    first = RunDirLock.acquire(run_dir)
    with pytest.raises(RunDirClaimError, match=rf"in use by pid {os.getpid()} on host .*\.lock"):
        RunDirLock.acquire(run_dir)  # (another open file: refused as another process is)
    first.release()
    RunDirLock.acquire(run_dir).release()


def test_the_holders_children_share_its_claim_through_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RunDirLock.acquire(tmp_path) as owner:
        for name, value in owner.env().items():
            monkeypatch.setenv(name, value)
        shared = RunDirLock.acquire(tmp_path)
        assert shared.shared and shared.env() == owner.env()
        monkeypatch.setenv(OWNER_ENV, "1 elsewhere")
        with pytest.raises(RunDirClaimError):
            RunDirLock.acquire(tmp_path)


def test_an_undone_claim_leaves_the_disk_as_it_was(tmp_path: Path) -> None:
    new = tmp_path / "new"
    RunDirLock.acquire(new).release(undo=True)
    assert not new.exists()
    old = tmp_path / "old"
    old.mkdir()
    RunLayout(old).lock.write_text("123 earlier\n")
    RunDirLock.acquire(old).release(undo=True)
    assert [p.name for p in old.iterdir()] == [".lock"]
    assert RunLayout(old).lock.read_text() == "123 earlier\n"
    claim = RunDirLock.acquire(old)
    (old / "config.json").write_text("{}")  # something was written: the claim stays on disk
    claim.release(undo=True)
    assert RunLayout(old).lock.read_text().startswith(f"{os.getpid()} ")


def _trainer(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "reference_trainer", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_second_trainer_on_a_live_run_dir_is_refused_and_a_killed_one_resumes_at_once(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    first = _trainer("--run-dir", str(run_dir), "--steps", "100000", *TINY)
    try:
        _wait_for(run_dir / "checkpoints" / "step-00000005", first)
        for extra in ((*TINY, "--steps", "8"), ("--resume", "--steps", "8")):
            second = run_module("-m", "reference_trainer", "--run-dir", str(run_dir), *extra)
            assert second.returncode == 2, second.stderr
            lines = second.stderr.strip().splitlines()
            assert len(lines) == 1, second.stderr
            assert f"is in use by pid {first.pid} on host" in lines[0]
    finally:
        first.kill()
        first.wait()
    last = checkpoint_step(complete_checkpoints(run_dir)[-1])
    resumed = run_module(
        "-m", "reference_trainer", "--run-dir", str(run_dir), "--resume", "--steps", str(last + 2)
    )
    assert resumed.returncode == 0, resumed.stderr
    ends = [e for e in read_journal(run_dir, warn=False) if e.kind == "run_end"]
    assert ends[-1]["status"] == "completed" and ends[-1].step == last + 2
