"""Sweep files: the grid, the seeds, and every problem named with its file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sweeps.sweep_file import SweepError, load_sweep, parse_sweep

ROOT = Path(__file__).resolve().parents[1]

GOOD = """\
sweep: b2
description: beta2 under bursts
scenario:
  trainer: {model: tiny, steps: 30, checkpoint_every: 10}
  faults: [{kind: grad_spike, probability: 0.05, factor: 100, seed: 7}]
  expect: {completed: true, params_finite: true}
grid:
  optimizer.beta2: [0.999, 0.95]
  precision: [fp32, bf16]
seeds: 3
min_success: 0.5
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def _problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(SweepError) as err:
        load_sweep(_write(tmp_path, text))
    return err.value.problems


def test_a_sweep_is_the_product_of_its_lists_times_its_seeds(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path, GOOD))
    assert (sweep.name, sweep.seeds, sweep.min_success, sweep.runs) == ("b2", (0, 1, 2), 0.5, 12)
    labels = [c.label for c in sweep.cells()]
    assert labels == [
        "optimizer.beta2=0.999, precision=fp32",
        "optimizer.beta2=0.999, precision=bf16",
        "optimizer.beta2=0.95, precision=fp32",
        "optimizer.beta2=0.95, precision=bf16",
    ]


def test_a_run_gets_its_cell_settings_and_its_seed_everywhere(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path, GOOD))
    cell = sweep.cells()[3]
    run = sweep.run_scenario(cell, 2)
    assert run.name == "cell04-seed2"
    assert run.trainer.optimizer is not None and run.trainer.optimizer.beta2 == 0.95
    assert (run.trainer.precision, run.trainer.seed, run.trainer.steps) == ("bf16", 2, 30)
    # Faults drawn at random differ between seeds, the same way in every cell.
    assert run.faults[0].seed == 7 + 2
    assert sweep.run_scenario(sweep.cells()[0], 2).faults[0].seed == 7 + 2
    assert sweep.scenario.faults[0].seed == 7  # the sweep's own scenario is untouched


def test_an_optimizer_by_name_and_its_fields_combine(tmp_path: Path) -> None:
    text = GOOD.replace(
        "  optimizer.beta2: [0.999, 0.95]\n  precision: [fp32, bf16]\n",
        "  optimizer.lr: [0.001]\n  optimizer: [adamw, sophia]\n",
    )
    sweep = load_sweep(_write(tmp_path, text))
    run = sweep.run_scenario(sweep.cells()[1], 0)
    assert run.trainer.optimizer is not None
    assert (run.trainer.optimizer.name, run.trainer.optimizer.lr) == ("sophia", 0.001)


def test_every_problem_is_named_with_its_line_at_once(tmp_path: Path) -> None:
    text = """\
sweep: bad
scenario:
  trainer: {model: huge}
  expect: {completed: true}
grid:
  optimizer.beta2: [0.9, 0.9]
  seed: [1, 2]
  colour: [red]
  precision: []
seeds: 0
min_success: 2
extra: 1
"""
    problems = _problems(tmp_path, text)
    joined = "\n".join(problems)
    assert "sweep.yaml:12: extra: unknown key" in joined
    assert "sweep.yaml:3: scenario.trainer.model" in joined
    assert "sweep.yaml:6: grid.optimizer.beta2: lists a value twice" in joined
    assert "sweep.yaml:7: grid.seed: seed cannot be swept: the seeds are given by `seeds`" in joined
    assert "sweep.yaml:8: grid.colour: unknown trainer field 'colour'" in joined
    assert "sweep.yaml:9: grid.precision: expected a non-empty list" in joined
    assert "sweep.yaml:10: seeds: expected a count >= 1" in joined
    assert "sweep.yaml:11: min_success: expected a success rate from 0 to 1" in joined
    assert len(problems) == 8


def test_a_value_no_trainer_accepts_names_its_cell(tmp_path: Path) -> None:
    text = GOOD.replace("[0.999, 0.95]", "[0.999, 1.5]")
    problems = _problems(tmp_path, text)
    assert len(problems) == 2  # both cells with the bad value, and no other
    assert (
        "grid: the cell optimizer.beta2=1.5, precision=fp32: trainer.optimizer.beta2"
        in (problems[0])
    )
    assert "less than 1" in problems[0] and "precision=bf16" in problems[1]
    text = GOOD.replace("precision: [fp32, bf16]", "precision: [fp64]")
    assert "trainer.precision" in _problems(tmp_path, text)[0]


def test_too_many_runs_and_a_sweep_that_is_no_mapping_are_refused(tmp_path: Path) -> None:
    text = GOOD.replace("seeds: 3", "seeds: 5001")
    assert "past 10000 runs" in _problems(tmp_path, text)[0]
    with pytest.raises(SweepError, match="a sweep is a mapping"):
        parse_sweep(["not", "a", "sweep"], "x.yaml")
    with pytest.raises(SweepError, match="cannot read sweep"):
        load_sweep(tmp_path / "missing.yaml")


def test_a_list_of_seeds_is_kept_and_a_repeated_seed_refused(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path, GOOD.replace("seeds: 3", "seeds: [5, 9]")))
    assert sweep.seeds == (5, 9)
    assert "lists a seed twice" in _problems(tmp_path, GOOD.replace("seeds: 3", "seeds: [5, 5]"))[0]


def test_a_command_trainer_sweeps_its_command_and_env(tmp_path: Path) -> None:
    text = """\
scenario:
  trainer: {command: "python train.py --seed {seed}", steps: 20}
  expect: {completed: true}
grid:
  command: ["python train.py --seed {seed}", "python train.py --guard --seed {seed}"]
  env.LR: ["0.1", "10"]
"""
    sweep = load_sweep(_write(tmp_path, text))
    assert sweep.name == "sweep" and sweep.seeds == (0,)
    run = sweep.run_scenario(sweep.cells()[3], 0)
    assert run.trainer.command == "python train.py --guard --seed {seed}"
    assert run.trainer.env == {"LR": "10"}
    bad = text.replace("  env.LR", "  optimizer: [sophia]\n  env.LR")
    assert "optimizer applies to the reference trainer" in _problems(tmp_path, bad)[0]


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios" / "sweeps").glob("*.yaml")))
def test_the_shipped_sweep_files_are_valid(path: Path) -> None:
    sweep = load_sweep(path)
    assert sweep.runs >= 2 and sweep.description


def test_the_command_refuses_a_bad_file_or_option_with_exit_2(tmp_path: Path) -> None:
    from .conftest import run_module

    bad = _write(tmp_path, "scenario: {expect: {completed: true}}\ngrid: {colour: [red]}\n")
    done = run_module("-m", "harness", "sweep", str(bad), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "sweep.yaml:2: grid.colour: unknown trainer field" in (
        done.stderr
    )
    done = run_module("-m", "harness", "sweep", str(bad), "--seeds", "0")
    assert done.returncode == 2 and "--seeds: expected a positive number" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written
