"""The learning-rate controller (opt-in `rl_lr`) in real tiny runs: after an lr spike it
lowers the learning rate the fixed schedule keeps, a clean run never looks unstable to it,
a rollback is learned from, it changes nothing but the learning rate, and a resume is
bit-exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.records.journal import Journal
from reference_trainer.config import TrainConfig
from reference_trainer.stability.rl_lr import RlLrConfig
from tests.stability_support import config, run
from tests.test_trainer import assert_same_tensors, final_state

pytestmark = pytest.mark.slow

STEPS, SPLIT = 24, 12
#: One lr x100 step: the loss of the steps after it jumps far above the window's.
SPIKE = [{"kind": "lr_spike", "at_step": 8, "factor": 100}]


def rl_config(steps: int = STEPS, *, fragile: bool = True, **fields: Any) -> TrainConfig:
    cfg = config(steps=steps, fragile=fragile, checkpoint_every=SPLIT)
    cfg.stability.rl_lr = RlLrConfig(enabled=True, **fields)
    return cfg


def decisions(journal: Journal) -> list[dict[str, Any]]:
    return [e.fields for e in journal.of_kind("lr_decided")]


def lrs(journal: Journal) -> dict[int, float]:
    return {step: event["lr"] for step, event in journal.steps().items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Journal]:
    run_dir = tmp_path_factory.mktemp("rl_lr") / "straight"
    result, journal = run(run_dir, rl_config(), SPIKE)
    assert result.status == "completed"
    return run_dir, journal


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    run_dir = tmp_path_factory.mktemp("rl_lr") / "fixed"
    return run(run_dir, config(steps=STEPS, fragile=True, checkpoint_every=SPLIT), SPIKE)[1]


def test_after_an_lr_spike_it_lowers_what_the_fixed_schedule_keeps(
    straight: tuple[Path, Journal], fixed: Journal
) -> None:
    journal = straight[1]
    assert not decisions(fixed)
    first, second = decisions(journal)
    assert (first["from_step"], second["from_step"]) == (11, 21)
    assert first["state"]["unstable"] and first["details"]["unstable_steps"] >= 2
    assert first["multiplier"] < 1.0 and first["reward"] < 0
    # Up to the decision both runs trained alike; after it, at the multiplier chosen.
    assert journal.losses()[:10] == fixed.losses()[:10]
    for step in range(11, 21):
        assert lrs(journal)[step] == pytest.approx(lrs(fixed)[step] * first["multiplier"])
        assert lrs(journal)[step] < lrs(fixed)[step]


def test_a_clean_run_never_looks_unstable_to_it(tmp_path: Path) -> None:
    """Negative control: the same controller on a fault-free run."""
    result, journal = run(tmp_path / "clean", rl_config(steps=20))
    assert result.status == "completed"
    made = decisions(journal)
    assert len(made) == 2
    assert not any(d["state"]["unstable"] or d["details"]["unstable_steps"] for d in made)


def test_allowed_only_the_multiplier_1_it_trains_as_the_fixed_schedule(
    tmp_path: Path, fixed: Journal
) -> None:
    """The controller's whole effect is its multiplier: allowed only 1.0, the run is the
    fixed schedule's to the last bit (its decisions are still made and journaled)."""
    journal = run(tmp_path / "one", rl_config(multipliers=(1.0,)), SPIKE)[1]
    assert len(decisions(journal)) == 2
    assert journal.losses() == fixed.losses()
    assert lrs(journal) == lrs(fixed)


def test_a_rollback_is_learned_from(tmp_path: Path) -> None:
    """With the guards on, the spike is caught and rolled back (twice: the checkpoint of
    step 15 already holds the spike's update); each time the multiplier in force is
    penalized, and the next decision, journaled at the step after the rollback, is a lower
    one, never the one that just failed."""
    cfg = rl_config(steps=STEPS, fragile=False, epsilon=0.0)
    cfg.checkpoint_every = 5
    faults = [{"kind": "lr_spike", "at_step": 15, "factor": 100}]  # as test_stability's
    result, journal = run(tmp_path / "guarded", cfg, faults)
    assert result.status == "completed"
    rollbacks = [e for e in journal.of_kind("recovered") if e["action"].startswith("rollback")]
    rolled = [d for d in decisions(journal) if d["details"].get("rollback")]
    assert len(rolled) == len(rollbacks) >= 1
    in_force = 1.0
    for decision in rolled:
        assert decision["reward"] == -1.0 and decision["state"]["unstable"]
        assert decision["details"]["previous"] == in_force
        assert decision["multiplier"] < 1.0 and decision["multiplier"] != in_force
        in_force = decision["multiplier"]


def test_resume_with_the_controller_is_bit_exact(
    straight: tuple[Path, Journal], tmp_path: Path
) -> None:
    split = tmp_path / "split"
    cfg = rl_config()
    run(split, cfg, SPIKE, stop_after=SPLIT)
    resumed = run(split, cfg, SPIKE, resume=True)[1]
    # The window of steps 11-12, the table, the multiplier and the generator were saved:
    # the decision at step 20 and every loss after the split are the uninterrupted run's.
    assert decisions(resumed) == decisions(straight[1])
    assert resumed.losses() == straight[1].losses()  # exact
    a, b = final_state(straight[0]), final_state(split)
    assert a["trainer"]["rl_lr"]["decisions"] == 2
    assert_same_tensors(a["trainer"]["rl_lr"], b["trainer"]["rl_lr"], "rl_lr")
    assert_same_tensors(a["model"], b["model"], "model")
