"""A sweep's arms (named sets of mechanisms on) and its fault mix drawn per seed as a soak
draws it: what a run gets, the protection sweep's file, every problem named at once, and a
tiny two-seed run of the protection sweep that shows the machinery end to end."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from faults.plan import FaultPlan
from harness.mechanisms import KEPT_BY_FRAGILE, LAUNCHER_MECHANISMS, MECHANISMS
from harness.records.events import FaultInjected
from harness.records.journal import read_journal
from harness.soak.plan import draw_plan, restarts_needed
from harness.soak.soak import SoakOptions, invariants
from harness.sweeps.sweep_file import SweepError, load_sweep, parse_sweep
from reference_trainer.stability.mechanisms import StabilityConfig
from reference_trainer.stability.registry import disable, fragile

ROOT = Path(__file__).resolve().parents[1]
PROTECTION = ROOT / "scenarios" / "sweeps" / "protection.yaml"

SWEEP = """\
sweep: arms
scenario:
  trainer: {model: tiny, world_size: 1, steps: 60, checkpoint_every: 20}
  expect: {completed: true, kept_params_finite: true}
arms:
  bare: []
  clipped: [clipping, lr_floor]
  guarded: [clipped, nonfinite_guard]
fault_mix: {rate: 0.05, kinds: [nan_grad, kill, truncate]}
grid:
  optimizer.beta2: [0.999, 0.95]
seeds: 3
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def _stability(trainer_disable: list[str]) -> StabilityConfig:
    """The trainer's own configuration for a run's ``disable`` list."""
    config = StabilityConfig()
    for name in trainer_disable:
        if name not in LAUNCHER_MECHANISMS:
            disable(config, name)
    return config


def test_arms_are_the_slowest_axis_and_include_earlier_arms(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path, SWEEP))
    assert [c.label for c in sweep.cells()][:3] == [
        "arm=bare, optimizer.beta2=0.999",
        "arm=bare, optimizer.beta2=0.95",
        "arm=clipped, optimizer.beta2=0.999",
    ]
    assert sweep.runs == 3 * 2 * 3
    guarded = sweep.run_scenario(sweep.cells()[5], 1).trainer
    on = set(MECHANISMS) - set(guarded.disable) - set(KEPT_BY_FRAGILE)
    assert on == {"clipping", "lr_floor", "nonfinite_guard"}
    assert (guarded.preset, guarded.optimizer and guarded.optimizer.beta2) == ("reference", 0.95)


def test_an_empty_arm_is_the_fragile_preset_and_a_full_one_the_reference() -> None:
    data = yaml.safe_load(PROTECTION.read_text())
    sweep = parse_sweep(data, str(PROTECTION))
    first, *_, last = sweep.cells()
    bare = sweep.run_scenario(first, 0).trainer
    full = sweep.run_scenario(last, 0).trainer
    # Judged by the trainer's own configuration, not by the arm's lists.
    assert repr(_stability(bare.disable)) == repr(fragile())
    assert bare.restarts == 0
    assert full.disable == [] and repr(_stability(full.disable)) == repr(StabilityConfig())
    assert full.restarts > 0


def test_every_arm_meets_the_soaks_faults_of_its_seed(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path, SWEEP))
    cells = sweep.cells()
    for seed in sweep.seeds:
        runs = [sweep.run_scenario(cell, seed) for cell in cells]
        soak = list(draw_plan(seed=seed, steps=60, rate=0.05,
                              kinds=["nan_grad", "kill", "truncate"], world_size=1,
                              checkpoint_every=20))  # fmt: skip
        for run in runs:
            assert run.faults == soak
            assert run.trainer.max_restarts >= restarts_needed(FaultPlan(tuple(run.faults)))
    drawn = [tuple(sweep.run_scenario(cells[0], s).faults) for s in sweep.seeds]
    assert len(set(map(repr, drawn))) == len(drawn)  # each seed its own mix


def test_the_protection_sweep_nests_its_layers_and_judges_by_the_soaks_invariants() -> None:
    data = yaml.safe_load(PROTECTION.read_text())
    sweep = parse_sweep(data, str(PROTECTION))
    soak = invariants(SoakOptions(out_dir=Path("unused"), max_stall=300.0, loss_tolerance=0.1))
    assert sweep.scenario.expect == soak
    assert len(sweep.seeds) >= 20 and sweep.fault_mix is not None
    assert sweep.fault_mix.kinds is None  # every kind the soak draws
    ons = [set(a.on) for a in sweep.arms]
    assert ons[0] == set() and all(a < b for a, b in itertools.pairwise(ons))
    assert ons[-1] == set(MECHANISMS) - set(KEPT_BY_FRAGILE)


def _problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(SweepError) as err:
        load_sweep(_write(tmp_path, text))
    return err.value.problems


def test_every_problem_of_arms_and_fault_mix_is_named_with_its_line(tmp_path: Path) -> None:
    text = """\
sweep: bad
scenario:
  trainer: {model: tiny, steps: 60, checkpoint_every: 20, preset: fragile}
  expect: {completed: true}
arms:
  bare: []
  clipping: [clipping]
  seatbelts: [seatbelt, bare]
  again: []
fault_mix: {rate: 2, kinds: [nan_grad, teleport], every: 3}
grid:
  disable: [[clipping]]
"""
    problems = _problems(tmp_path, text)
    path = str(tmp_path / "sweep.yaml")
    expected = [
        f"{path}:7: arms.clipping: an arm may not be named like the mechanism 'clipping'",
        f"{path}:8: arms.seatbelts: unknown mechanism(s) 'seatbelt'; expected an earlier arm",
        f"{path}:9: arms.again: switches on the same mechanisms as the arm 'bare'",
        f"{path}:10: fault_mix.every: unknown key; a fault mix has rate, kinds",
        f"{path}:10: fault_mix.rate: expected faults per step in (0, 1], got 2",
        f"{path}:10: fault_mix.kinds: fault kind(s) 'teleport' cannot be drawn by a soak",
        f"{path}:3: scenario.trainer.preset: set by the arms; leave it out of the trainer",
        f"{path}:12: grid.disable: disable is set by the arms; sweep it as an arm",
    ]
    assert len(problems) == len(expected), problems
    for want in expected:
        assert any(p.startswith(want) for p in problems), (want, problems)


def _tiny_protection(tmp_path: Path) -> Path:
    """The protection sweep cut to one seed, two arms and 12 steps of NaN gradients (the
    seed draws its faults for both arms alike: test_every_arm_meets_the_soaks_faults_of_its_seed
    shows that for every seed of the real sweep)."""
    data: dict[str, Any] = yaml.safe_load(PROTECTION.read_text())
    data["scenario"]["trainer"].update(steps=12, checkpoint_every=6, timeout=240)
    data["scenario"]["trainer"].pop("resume_after")
    data["scenario"]["expect"] = {"completed": True, "kept_params_finite": True}
    data["fault_mix"] = {"rate": 0.2, "kinds": ["nan_grad"]}
    data["arms"] = {"fragile": [], "all three layers": data["arms"]["all three layers"]}
    data["arms"]["all three layers"] = sorted(set(MECHANISMS) - set(KEPT_BY_FRAGILE))
    data["seeds"] = 1
    path = tmp_path / "tiny-protection.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.slow
def test_a_tiny_protection_sweep_fails_the_bare_arm_and_passes_the_guarded(
    tmp_path: Path,
) -> None:
    from harness.sweeps.run_sweep import SweepOptions, run_sweep

    sweep = load_sweep(_tiny_protection(tmp_path))
    options = SweepOptions(
        out_dir=tmp_path / "out", cores=2, cache_dir=tmp_path / "cache", progress=False
    )
    run = run_sweep(sweep, options)
    assert run.complete and not run.interrupted
    bare, guarded = sweep.cells()
    assert (bare.label, guarded.label) == ("arm=fragile", "arm=all three layers")
    for seed in sweep.seeds:
        (b,), (g,) = ([r for r in run.of_cell(c) if r.seed == seed] for c in (bare, guarded))
        # Both arms met the same drawn faults: the journals say what was injected.
        assert _injected(Path(b.run_dir)) == _injected(Path(g.run_dir)) != []
        (kept,) = [c for c in b.result.checks if c.name == "kept_params_finite"]
        assert kept.judged and not kept.passed, b.result.to_dict()
        assert g.passed, g.result.to_dict()


def _injected(run_dir: Path) -> list[tuple[str, int | None]]:
    """(kind, step) of each fault the run's journal saw injected (once per step: a
    restarted attempt may journal it again)."""
    journal = read_journal(run_dir, warn=False)
    return sorted({(str(e["fault"]), e.step) for e in journal.of_kind(FaultInjected)})
