"""A trainer SIGKILLed at any moment of its start-up (the tokenizer and the build take
seconds) leaves a run dir that ``--resume`` and a fresh start both take up and train; so
does a ``config.json`` torn by hand, and the directory older versions left (journal and
control channel made, configuration not yet written)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from reference_trainer.cli import main as trainer

from .conftest import ROOT, TOKENIZER_CACHE

STEPS = ("--steps", "3")


def killed_when(appears: Callable[[RunLayout], Path]) -> Callable[[Path], None]:
    """A start-up SIGKILLed as soon as ``appears(layout)`` exists."""

    def make(run_dir: Path) -> None:
        # No shared tokenizer: training one is the long moment of a real start-up.
        env = {k: v for k, v in os.environ.items() if k != TOKENIZER_CACHE}
        env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "reference_trainer", "--run-dir", str(run_dir), *STEPS],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        path, deadline = appears(RunLayout(run_dir)), time.monotonic() + 120
        try:
            while not path.exists():
                assert proc.poll() is None, f"the trainer ended before {path} appeared"
                assert time.monotonic() < deadline, f"{path} never appeared"
                time.sleep(0.002)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    return make


def torn_config(run_dir: Path) -> None:
    """A finished start whose config.json was then cut short (as an in-place write was)."""
    killed_when(lambda layout: layout.journal)(run_dir)
    config = RunLayout(run_dir).config
    if config.exists():
        config.write_bytes(config.read_bytes()[:100])
    else:
        config.write_text('{"preset": "ti')


def older_layout(run_dir: Path) -> None:
    """What a kill during the build left before: journal and control made, no config."""
    layout = RunLayout(run_dir)
    for folder in (layout.journal, layout.control):
        folder.mkdir(parents=True)
    layout.journal_file(0).touch()


MOMENTS = {
    "run dir made": killed_when(lambda layout: layout.root),
    "journal made": killed_when(lambda layout: layout.journal),
    "control made": killed_when(lambda layout: layout.control),
    "tokenizer written": killed_when(lambda layout: layout.tokenizer),
    "torn config.json": torn_config,
    "older layout": older_layout,
}


def trained(run_dir: Path) -> None:
    ends = [e for e in read_journal(run_dir, warn=False) if e.kind == "run_end"]
    assert ends and ends[-1]["status"] == "completed" and ends[-1].step == 3, ends
    json.loads(RunLayout(run_dir).config.read_text())  # whole


@pytest.mark.slow
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_start_up_killed_at_any_moment_can_be_resumed_and_started_afresh(
    tmp_path: Path, moment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken"
    MOMENTS[moment](broken)
    fresh = Path(shutil.copytree(broken, tmp_path / "fresh", symlinks=True))
    resumed = Path(shutil.copytree(broken, tmp_path / "resumed", symlinks=True))
    assert trainer(["--run-dir", str(resumed), "--resume", *STEPS]) == 0, capsys.readouterr()
    trained(resumed)
    assert trainer(["--run-dir", str(fresh), "--preset", "tiny", *STEPS]) == 0, capsys.readouterr()
    trained(fresh)
    if moment in ("torn config.json", "older layout"):
        err = capsys.readouterr().err
        assert err.count("its start-up never finished") == 2, err
        assert "(--resume has nothing to resume)" in err
