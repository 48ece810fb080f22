"""A checkpoint that cannot be written is named in words (disk full, file too large) with
its path and the bytes it needed, and ends the run as a failure (exit 1), not bad input."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.records.journal import read_journal
from harness.running.process_tree import descendants
from reference_trainer.checkpoints.storage import explain, state_bytes

from .conftest import ROOT

TORCH_OPAQUE = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")


def test_errno_is_named_in_words(tmp_path: Path) -> None:
    path = tmp_path / "state.pt"
    full = explain(OSError(errno.ENOSPC, "No space left on device"), path, 5_000)
    assert full.startswith(f"disk full: writing {path} needs about 5,000 bytes, ")
    assert "bytes free there" in full
    big = explain(OSError(errno.EFBIG, "File too large"), path, 5_000)
    assert big.startswith(f"file too large: writing {path} needs about 5,000 bytes")


def test_torchs_opaque_error_is_explained_by_the_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=1_000))
    message = explain(TORCH_OPAQUE, tmp_path / "state.pt", 3_433_730)
    assert message == (
        f"disk full: writing {tmp_path / 'state.pt'} needs about 3,433,730 bytes, "
        "1,000 bytes free there"
    )


def test_an_unexplained_failure_keeps_its_own_words(tmp_path: Path) -> None:
    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        pytest.skip("this process has a file-size limit")
    message = explain(TORCH_OPAQUE, tmp_path / "state.pt", 10)
    assert message.startswith(f"cannot write {tmp_path / 'state.pt'}: RuntimeError: [enforce")


def test_state_bytes_counts_nested_tensors() -> None:
    state: dict[str, Any] = {"a": torch.zeros(10), "b": [torch.zeros(2, dtype=torch.int64), 3]}
    assert state_bytes(state) == 10 * 4 + 2 * 8


def _file_size_limit(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from write(), not a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.slow
def test_a_save_past_the_file_size_limit_fails_the_run_in_words(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["--preset", "tiny", "--steps", "2", "--checkpoint-every", "1", "--log-every", "100"]
    done = subprocess.run(
        [sys.executable, "-m", "reference_trainer", *argv, "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)),
        preexec_fn=lambda: _file_size_limit(200_000),  # the tokenizer fits, state.pt not
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr  # training had started: a failure, not bad input
    assert len(lines) == 1 and lines[0].startswith("reference_trainer: error: "), done.stderr
    assert "checkpoint of step 1 not saved: file too large: writing " in lines[0]
    assert "state.pt needs about " in lines[0]
    assert "past the file-size limit of 200,000 bytes (ulimit -f)" in lines[0]
    assert "inline_container" not in lines[0]


def test_a_run_that_dies_while_its_background_save_fails_leaves_the_process_as_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step raises while the background save before it fails: the run raises, and its
    hang monitor is stopped and its signal handlers put back all the same (in-process, a
    monitor left watching would kill this very process once the heartbeat went stale)."""
    from reference_trainer.checkpoints.manager import CheckpointManager
    from reference_trainer.step import Trainer
    from tests.stability_support import config, run

    persist, step = CheckpointManager._persist, Trainer.step

    def failing_save(self: CheckpointManager, at: int, *args: Any) -> None:
        if at == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        persist(self, at, *args)

    def dying_step(self: Trainer, at: int) -> Any:
        if at == 3:  # while step 2's checkpoint is being written, and failing
            time.sleep(0.5)
            raise RuntimeError("the step died")
        return step(self, at)

    monkeypatch.setattr(CheckpointManager, "_persist", failing_save)
    monkeypatch.setattr(Trainer, "step", dying_step)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    with pytest.raises(Exception, match="background checkpoint save failed: OSError") as raised:
        run(tmp_path, config(steps=6, checkpoint_every=2))
    assert "the step died" in str(raised.value.__context__)  # told too, in the traceback
    (end,) = read_journal(tmp_path).of_kind("run_end")  # and the run's end journaled
    assert end["status"] == "failed" and "the step died" in end["reason"]
    assert not list((tmp_path / "heartbeats").glob("*.json"))  # the monitor's cue to leave
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    monitors = [
        pid
        for pid in descendants(os.getpid())
        if b"hang_monitor" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert monitors == []
