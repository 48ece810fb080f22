"""`tightrope soak` refuses bad input before anything runs, naming what was wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_module


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--rate", "2"], "--rate: expected faults per step in (0, 1], got '2'"),
        (["--rate", "often"], "--rate: expected faults per step in (0, 1], got 'often'"),
        (["--kinds", "nan_grad,nan_gard"], "fault kind(s) 'nan_gard' cannot be drawn by a soak"),
        (["--kinds", "toxic_contamination"], "'toxic_contamination' cannot be drawn"),
        (["--minutes", "1", "--steps", "300"], "not allowed with argument"),
        (["--minutes", "-1"], "--minutes: expected a positive number of minutes"),
        (["--steps", "60"], "--steps 60: a soak spans at least two checkpoints (100 steps"),
        (["--seed", "-3"], "--seed: expected an integer >= 0"),
    ],
)
def test_bad_input_is_refused_with_exit_2_naming_it(
    args: list[str], said: str, tmp_path: Path
) -> None:
    done = run_module("-m", "harness", "soak", *args, "--scorecard", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in " ".join(done.stderr.split())
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written
