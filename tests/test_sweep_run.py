"""`tightrope sweep` end to end: a 2 x 2 grid of the reference trainer judged, stopped,
continued from its cached runs, and run again under pytest; a command trainer's sweep.

One seed per cell: every run is a trainer process, and what these tests show (a grid's
cells judged apart, a stop keeping what finished, the cache reused, a command swept) needs
one run per cell. Several seeds per cell are counted in tests/test_sweep_stats.py, and run
end to end in tests/test_sweep_arms.py's tiny protection sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.commands.main import main as tightrope

from .conftest import ROOT

pytestmark = pytest.mark.slow

GRID = """\
sweep: guards
description: NaN gradients, with the guards on and off, at two beta2 values.
scenario:
  trainer: {model: tiny, steps: 12, checkpoint_every: 6, timeout: 120}
  faults: [{kind: nan_grad, at_step: 8}]
  expect: {completed: true, params_finite: true}
grid:
  preset: [reference, fragile]
  optimizer.beta2: [0.999, 0.95]
seeds: 1
min_success: 0.5
"""


def _env(cache: Path) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TIGHTROPE_CACHE=str(cache))


def _sweep(args: list[str], cache: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``tightrope sweep ARGS`` in this process (its trainer processes start warm, as the
    suite runner's do here: tests/conftest.py) from the checkout, with ``cache``: exit code
    and output."""
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        patch.setenv("TIGHTROPE_CACHE", str(cache))
        code = tightrope(["sweep", *args])
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def _ctrl_c_reaches_it() -> None:
    """In the child before it runs: SIGINT handled as the terminal's Ctrl-C would be. A test
    session started in the background of a non-interactive shell has SIGINT ignored, and a
    Python started with SIGINT ignored keeps ignoring it (no KeyboardInterrupt): the sweep
    then never heard the stop, ran every run and exited 1 rather than 130."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_grid_is_judged_and_a_stopped_sweep_goes_on_from_its_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file, out, cache = tmp_path / "guards.yaml", tmp_path / "out", tmp_path / "cache"
    file.write_text(GRID)
    # Stopped (Ctrl-C) once two runs have finished: what finished is kept. One run at a
    # time, so that the stop finds runs still to do whatever the machine's core count.
    first = subprocess.Popen(
        [sys.executable, "-m", "harness", "sweep", str(file), "--out", str(out), "--cores", "1"],
        cwd=ROOT,
        env=_env(cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ctrl_c_reaches_it,
    )
    deadline = time.monotonic() + 240
    while len(list((cache / "sweep-runs").glob("*.json"))) < 2 and time.monotonic() < deadline:
        assert first.poll() is None, first.communicate()[0]
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    said = first.communicate(timeout=60)[0]
    assert first.returncode == 130, said
    partial = json.loads((out / "sweep.json").read_text())
    assert partial["complete"] is False and partial["interrupted"] is True
    kept = len(partial["runs"])
    assert 2 <= kept < 4

    code, said = _sweep([str(file), "--out", str(out)], cache, capsys)
    assert code == 1, said  # the fragile cells fall short
    data = json.loads((out / "sweep.json").read_text())
    assert data["complete"] is True and len(data["runs"]) == 4
    assert sum(r["cached"] for r in data["runs"]) >= kept
    cells = {c["label"]: c for c in data["cells"]}
    for beta2 in ("0.999", "0.95"):
        guarded = cells[f"preset=reference, optimizer.beta2={beta2}"]
        bare = cells[f"preset=fragile, optimizer.beta2={beta2}"]
        assert (guarded["passed"], guarded["runs"]) == (1, 1)
        assert (bare["passed"], bare["failed_checks"]) == (0, {"params_finite": 1})
    assert "below min_success 0.5" in said
    assert {p.name for p in out.iterdir()} >= {"sweep.json", "sweep.md", "sweep.html", "runs"}

    # The same file under pytest: one item per cell, every run reused from the cache.
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", str(file), "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "--tightrope-scorecard", str(tmp_path / "pytest")],
        cwd=ROOT, env=_env(cache), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert "2 failed, 2 passed" in tested.stdout, tested.stdout + tested.stderr
    assert "success rate below min_success 0.5" in tested.stdout
    reports = tmp_path / "pytest" / "sweep-guards"
    assert (reports / "sweep.md").is_file()
    assert not (reports / "runs").exists()  # nothing ran again


def test_a_command_trainer_sweeps_its_variants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file, out = tmp_path / "tutorial.yaml", tmp_path / "out"
    trainer = "{python} tests/trainers/tutorial_loop.py --steps {steps} --seed {seed}"
    file.write_text(
        f"""\
sweep: tutorial-guard
scenario:
  trainer: {{command: "{trainer}", steps: 20, timeout: 120}}
  faults: [{{kind: nan_grad, at_step: 8, target: "blocks.0.*"}}]
  expect: {{params_finite: true, completed: true}}
grid:
  command: ["{trainer}", "{trainer} --guard"]
seeds: 1
"""
    )
    code, said = _sweep([str(file), "--out", str(out)], tmp_path / "cache", capsys)
    assert code == 0, said  # no min_success: nothing falls short
    bare, guarded = json.loads((out / "sweep.json").read_text())["cells"]
    assert (bare["passed"], guarded["passed"]) == (0, 1)
    assert bare["failed_checks"] == {"params_finite": 1}
