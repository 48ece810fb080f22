"""Every stability mechanism of the reference trainer, shown twice: with it, the injected
fault is detected and recovered (judged by observation: parameters finite, training
completed, final loss near a clean run of the same seed); without it, the same fault
visibly breaks the run."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from faults import build_injector, parse_fault
from faults.injector import Injection
from harness.records.journal import Journal
from harness.run_layout import RunLayout
from reference_trainer.config import TrainConfig
from reference_trainer.errors import CheckpointError, TrainingFailed
from reference_trainer.model.optim import peak_lr
from reference_trainer.train import RunResult

from .stability_support import claims, config, final_loss, finite_at_end, near, run

pytestmark = pytest.mark.slow

NAN_AT_12 = [{"kind": "nan_grad", "at_step": 12, "target": "blocks.0.attn.*"}]


def damage_checkpoints(injector: Any, run_dir: Path) -> list[Injection]:
    """Apply a checkpoint fault to the run in ``run_dir`` as the agent does: with the run's
    checkpoint folder."""
    return list(injector.apply(run_dir, checkpoints=RunLayout(run_dir).checkpoints))


def resumed_from(
    first: Path, run_dir: Path, cfg: TrainConfig, faults: list[dict[str, Any]]
) -> tuple[RunResult, Journal]:
    """The rest of ``cfg`` with ``faults``, resumed from a copy of ``first`` (a fault-free
    start the runs of the same length share); the journal holds every step."""
    shutil.copytree(first, run_dir)
    return run(run_dir, cfg, faults, resume=True)


@pytest.fixture(scope="module")
def first_10(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Steps 1-10 of a fault-free 40-step run, stopped with its checkpoint at 10: the part
    the 40-step runs below share (their faults come at step 12 or later)."""
    run_dir = tmp_path_factory.mktemp("first10") / "run"
    run(run_dir, config(steps=40), stop_after=10)
    return run_dir


@pytest.fixture(scope="module")
def clean_fp32(tmp_path_factory: pytest.TempPathFactory, first_10: Path) -> float:
    """Final loss of a fault-free 40-step run (the baseline every fp32 case compares to)."""
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    return final_loss(resumed_from(first_10, run_dir, config(steps=40), [])[1])


def test_nonfinite_guard_skips_the_poisoned_step(
    tmp_path: Path, clean_fp32: float, first_10: Path
) -> None:
    # Gradient surgery would repair this one block's gradient instead (tests/test_surgery.py).
    cfg = config(steps=40, disable=("surgery",))
    result, journal = resumed_from(first_10, tmp_path / "run", cfg, NAN_AT_12)
    assert result.status == "completed"
    step12 = journal.steps()[12]
    assert step12["skipped"] is True and math.isnan(step12["grad_norm"])
    (claim,) = claims(journal, "detected", "nonfinite_guard")
    assert claim.step == 12
    assert finite_at_end(journal)
    assert near(final_loss(journal), clean_fp32, rel=0.05)


def test_without_the_guard_nan_reaches_the_weights(tmp_path: Path) -> None:
    # 20 steps: the parameter check of step 20 finds the NaN still there.
    _, journal = run(tmp_path, config(steps=20, disable=("nonfinite_guard", "recovery")), NAN_AT_12)
    assert journal.steps()[12]["params_finite"] is False
    assert math.isnan(final_loss(journal)) and not finite_at_end(journal)
    assert not claims(journal, "detected", "nonfinite_guard")


def test_loss_spike_is_detected_and_rolled_back(
    tmp_path: Path, clean_fp32: float, first_10: Path
) -> None:
    faults = [{"kind": "lr_spike", "at_step": 15, "factor": 100.0}]
    result, journal = resumed_from(first_10, tmp_path / "run", config(steps=40), faults)
    assert result.status == "completed"
    detected = claims(journal, "detected", "robust_zscore")
    assert detected and 16 <= detected[0].step <= 17  # the loss jumps the step after
    (rollback,) = claims(journal, "recovered", "rollback")
    assert rollback["details"]["checkpoint"] == "step-00000010"
    assert near(final_loss(journal), clean_fp32, rel=0.05)


def test_without_spike_detection_the_spike_ruins_the_run(
    tmp_path: Path, clean_fp32: float, first_10: Path
) -> None:
    # The layer swing detector also sees this spike's aftermath (gradients 100x their
    # norm) and its skips end in a rollback: off too, for the loss detectors' control.
    faults = [{"kind": "lr_spike", "at_step": 15, "factor": 100.0}]
    cfg = config(steps=40, disable=("spikes", "layer_stats"))
    _, journal = resumed_from(first_10, tmp_path / "run", cfg, faults)
    assert not claims(journal, "recovered")
    assert final_loss(journal) > 1.5 * clean_fp32


def test_recovery_escalates_through_every_level_then_stops_with_a_diagnosis(
    tmp_path: Path,
) -> None:
    faults = [{"kind": "inf_grad", "at_step": 12, "every": 1}]  # broken for good
    result, journal = run(tmp_path, config(steps=60), faults)
    assert result.status == "failed"
    actions = [(e["action"], e["details"]["level"]) for e in claims(journal, "recovered")]
    assert actions == [("rollback", 1), ("rollback_lower_lr", 2), ("fp32_retry", 3)]
    lowered = claims(journal, "recovered", "rollback_lower_lr")[0]["details"]
    # The same data again at a lower learning rate: skipping it is an option, not a default.
    assert lowered["lr_scale"] == pytest.approx(0.8) and "skipped_windows" not in lowered
    assert claims(journal, "detected", "recovery_exhausted")
    (end,) = journal.of_kind("run_end")
    assert end["status"] == "failed" and "diagnosis.md" in end["reason"]
    diagnosis = (tmp_path / "diagnosis.md").read_text()
    assert "| 4 | give_up |" in diagnosis and "non_finite_steps" in diagnosis


def test_without_recovery_a_lasting_fault_stalls_training(tmp_path: Path) -> None:
    faults = [{"kind": "inf_grad", "at_step": 12, "every": 1}]
    _, journal = run(tmp_path, config(steps=30, disable=("recovery",)), faults)
    skipped = [s for s, e in journal.steps().items() if e["skipped"]]
    assert skipped == list(range(12, 31))  # every step after the fault lost, unnoticed
    assert not claims(journal, "recovered")
    # diagnosis.md names the problem layer, but no recovery gave up.
    assert "recovery exhausted" not in (tmp_path / "diagnosis.md").read_text()


def test_a_damaged_latest_checkpoint_is_rejected_and_an_older_one_used(tmp_path: Path) -> None:
    cfg = config(steps=30)
    run(tmp_path, cfg, stop_after=20)
    damage = {"kind": "truncate", "at_step": 1, "file": "delta.bin"}  # 20 is a delta of 10
    damage_checkpoints(build_injector(parse_fault(damage)), tmp_path)
    result, journal = run(tmp_path, cfg, resume=True)
    assert result.status == "completed"
    (rejected,) = journal.of_kind("checkpoint_rejected")
    assert rejected["path"].endswith("step-00000020") and "manifest says" in rejected["reason"]
    loaded = [e["path"] for e in journal.of_kind("checkpoint_loaded")]
    assert loaded[-1].endswith("step-00000010")
    assert sorted(journal.steps()) == list(range(1, 31))


def test_without_integrity_checks_the_damaged_checkpoint_is_loaded(tmp_path: Path) -> None:
    cfg = config(steps=30, fragile=True)
    run(tmp_path, cfg, stop_after=20)
    damage = {"kind": "truncate", "at_step": 1, "file": "state.pt"}
    damage_checkpoints(build_injector(parse_fault(damage)), tmp_path)
    # Found once the run had started, so a failed run (exit 1), raised from the load's error.
    with pytest.raises(TrainingFailed, match=r"step-00000020/state\.pt is unreadable") as err:
        run(tmp_path, cfg, resume=True)
    assert isinstance(err.value.__cause__, CheckpointError)


def test_duplicates_are_dropped_before_they_reach_the_model(tmp_path: Path) -> None:
    faults = [{"kind": "duplicate_contamination", "at_step": 1, "rate": 0.05, "pool": 8}]
    _, journal = run(tmp_path, config(steps=40, batch_size=16), faults)
    steps = journal.of_kind("step")
    assert sum(e["contaminated_docs"] for e in steps) == 0
    drops = claims(journal, "detected", "dedup")
    dropped = sum(c["details"]["contaminated_dropped"] for c in drops)
    assert dropped >= 3
    assert all(
        sum(c["details"]["by_source"][s].values()) for c in drops for s in c["details"]["by_source"]
    )


def test_without_dedup_tagged_duplicates_reach_the_model(tmp_path: Path) -> None:
    faults = [{"kind": "duplicate_contamination", "at_step": 1, "rate": 0.05, "pool": 8}]
    # A copy also means what its original means: semantic dedup would catch it too.
    off = ("dedup", "semantic_dedup")
    _, journal = run(tmp_path, config(steps=40, batch_size=16, disable=off), faults)
    steps = journal.of_kind("step")
    docs, tainted = sum(e["docs"] for e in steps), sum(e["contaminated_docs"] for e in steps)
    assert tainted >= 3 and 0.01 < tainted / docs < 0.12
    assert not claims(journal, "detected", "dedup")


def test_level_two_skips_the_failing_data_only_when_asked(tmp_path: Path) -> None:
    cfg = config(steps=60)
    cfg.stability.recovery.skip_data = True
    faults = [{"kind": "inf_grad", "at_step": 12, "every": 1}]
    _, journal = run(tmp_path, cfg, faults)
    lowered = claims(journal, "recovered", "rollback_lower_lr")[0]["details"]
    assert lowered["skipped_windows"] > 0


@pytest.fixture(scope="module")
def first_30(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Steps 1-30 of a fault-free 60-step run, stopped with its checkpoint at 30: the part
    the 60-step runs below share (their faults come at step 35; a run resumed from it is
    bit-exact with one that never stopped: same losses, same claims)."""
    run_dir = tmp_path_factory.mktemp("first30") / "run"
    run(run_dir, config(steps=60), stop_after=30)
    return run_dir


@pytest.fixture(scope="module")
def clean_60_run(tmp_path_factory: pytest.TempPathFactory, first_30: Path) -> Any:
    """The journal of a fault-free 60-step run (the floor's run, the forecaster's baseline)."""
    run_dir = tmp_path_factory.mktemp("clean60") / "run"
    return resumed_from(first_30, run_dir, config(steps=60), [])[1]


@pytest.fixture(scope="module")
def clean_60(clean_60_run: Any) -> float:
    """Final loss of a fault-free 60-step run."""
    return final_loss(clean_60_run)


def test_the_last_fifth_trains_at_the_floor_and_without_it_trains_nothing(
    tmp_path: Path, clean_60_run: Any
) -> None:
    cfg = config(steps=60)
    with_floor = clean_60_run
    without = run(tmp_path / "zero", config(steps=60, disable=("lr_floor",)))[1]
    tail = range(49, 61)  # steps 49..60: the last 20%
    # The configured peak, not the run's highest lr: adaptive warmup may lower the last
    # warmup step below it.
    peak = peak_lr(cfg, world_size=1)
    assert max(e["lr"] for e in with_floor.steps().values()) <= peak
    assert all(with_floor.steps()[s]["lr"] == pytest.approx(0.1 * peak) for s in tail)
    assert {without.steps()[s]["lr"] for s in tail} == {0.0}
    # Twelve steps that train nothing cost loss the floored run keeps learning off.
    assert final_loss(with_floor) < final_loss(without)


# A learning-rate spike the forecaster sees and the robust z-score does not: the loss rises
# a few percent for several steps, each step's change within the batch noise.
LR_X70_AT_35 = [{"kind": "lr_spike", "at_step": 35, "factor": 70.0}]
WITH_FORECAST = ("robust_zscore", "early_max", "forecast")


def test_a_forecast_claim_above_its_band_rolls_back(
    tmp_path: Path, clean_60: float, first_30: Path
) -> None:
    cfg = config(steps=60)
    cfg.stability.spikes.acting = WITH_FORECAST
    result, journal = resumed_from(first_30, tmp_path / "run", cfg, LR_X70_AT_35)
    assert result.status == "completed"
    (detected,) = claims(journal, "detected")  # one claim, the forecaster's, and no other
    assert detected["detector"] == "forecast" and detected["details"]["side"] == "above"
    assert detected.step == 36  # the spiked update shows in the next step's loss
    (rollback,) = claims(journal, "recovered")
    assert rollback["action"] == "rollback" and rollback.step == detected.step
    assert rollback["details"]["checkpoint"] == "step-00000030"
    assert near(final_loss(journal), clean_60, rel=0.005)


@pytest.mark.parametrize("how", ["forecast journals only", "--disable spikes"])
def test_without_the_forecaster_acting_the_spike_costs_loss(
    tmp_path: Path, clean_60: float, first_30: Path, how: str
) -> None:
    if how == "--disable spikes":
        cfg = config(steps=60, disable=("spikes",))
    else:
        cfg = config(steps=60)
        cfg.stability.spikes.acting = ("robust_zscore", "early_max")
        cfg.stability.spikes.robust.level_window = 0  # the z-score of step changes alone
    _, journal = resumed_from(first_30, tmp_path / "run", cfg, LR_X70_AT_35)
    assert not claims(journal, "recovered")
    detected = {c["detector"] for c in claims(journal, "detected")}
    assert detected == ({"forecast"} if how == "forecast journals only" else set())
    assert final_loss(journal) > 1.02 * clean_60  # the spike's damage stays in the weights


def test_the_level_check_sees_the_lasting_rise_the_step_changes_hide(
    tmp_path: Path, first_30: Path
) -> None:
    """The same spike with the default detectors (the forecaster journals only): no step's
    change scores, but the loss stays up, and the robust z-score's level check (its recent
    median against the one before) claims it some steps later and recovery rolls back."""
    _, journal = resumed_from(first_30, tmp_path / "run", config(steps=60), LR_X70_AT_35)
    level = [c for c in claims(journal, "detected") if c["details"].get("level_shift")]
    assert level and all(c["detector"] == "robust_zscore" for c in level)
    assert 36 < level[0].step <= 36 + 2 * 15
    assert level[0]["details"]["level_recent"] > level[0]["details"]["level_before"]
    (rollback, *_) = claims(journal, "recovered")
    assert rollback.step == level[0].step and rollback["action"].startswith("rollback")
