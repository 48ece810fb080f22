"""Oracles of what a fault cost: lost steps, time to recovery, the fp16 loss scale and
contaminated data; each with a run that passes and its negative control."""

from __future__ import annotations

import math
from pathlib import Path

from harness.oracles import (
    ContaminationOracle,
    LossScaleRecoveredOracle,
    LostStepsOracle,
    MttrOracle,
)
from harness.oracles.health import LossScaleExpect
from harness.oracles.recovery import MttrExpect

from .oracle_runs import TARGET, Run, clean_run, nan_grad_run


def rollback_run(run_dir: Path) -> Run:
    """A loss spike at step 25, detected at 26, rolled back to the checkpoint of step 20."""
    run = Run(run_dir).steps(1, 24).fault(25, "lr_spike").step(25).step(26, loss=40.0)
    run.detect(26, "robust_zscore").rollback(26, to=20)
    return run.steps(21, TARGET).end()


# -- max_lost_steps ------------------------------------------------------------------------


def test_lost_steps_count_redone_and_skipped_steps(tmp_path: Path) -> None:
    evidence = rollback_run(tmp_path).evidence()
    check = LostStepsOracle(bound=6).judge(evidence)
    assert check.passed and check.figure == 6 and check.figures["redone"] == 6
    negative = LostStepsOracle(bound=5).judge(evidence)
    assert not negative.passed and negative.expected == "<= 5 steps"


def test_a_skipped_step_is_lost(tmp_path: Path) -> None:
    check = LostStepsOracle(bound=0).judge(nan_grad_run(tmp_path).evidence())
    assert not check.passed and check.figures == {"redone": 0, "skipped": 1}


def test_no_step_lost_in_a_clean_run(tmp_path: Path) -> None:
    assert LostStepsOracle(bound=0).judge(clean_run(tmp_path).evidence()).passed


def test_lost_steps_are_not_judged_when_rank0_took_no_step(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).emit("step", 1, rank=1, loss=1.0).end("failed", step=1)
    check = LostStepsOracle(bound=0).judge(run.evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "rank 0 reported no step" in check.detail


# -- mttr ----------------------------------------------------------------------------------


def test_mttr_of_a_skipped_step(tmp_path: Path) -> None:
    evidence = nan_grad_run(tmp_path).evidence()
    check = MttrOracle(max_steps=1, max_seconds=60).judge(evidence)
    assert check.passed, check.detail
    assert check.figures["steps"] == 1 and check.figures["recovered_at_step"] == 16
    assert check.unit == "s" and isinstance(check.figure, float) and check.figure < 60
    assert not MttrOracle(max_steps=0).judge(evidence).passed


def test_mttr_runs_to_the_first_good_step_after_the_rollback(tmp_path: Path) -> None:
    check = MttrOracle.from_expect(MttrExpect(max_steps=2)).judge(rollback_run(tmp_path).evidence())
    # Steps 25 and 26 after the fault, then step 21 redone from the checkpoint.
    assert check.passed and check.figures["steps"] == 2
    assert check.figures["recovered_at_step"] == 21


def test_mttr_counts_a_restart(tmp_path: Path) -> None:
    run = Run(tmp_path).steps(1, 11).fault(12, "kill").end("failed", step=11)
    run.restart(resume_at=10).steps(11, TARGET).end()
    check = MttrOracle(max_steps=0).judge(run.evidence())
    assert check.passed and check.figures["recovered_at_step"] == 11


def test_mttr_fails_over_its_seconds_bound(tmp_path: Path) -> None:
    check = MttrOracle(max_seconds=1e-9).judge(nan_grad_run(tmp_path).evidence())
    assert not check.passed and "too slow" in check.detail


def test_mttr_fails_when_training_never_recovers(tmp_path: Path) -> None:
    run = Run(tmp_path).steps(1, 14).fault(15)
    for step in range(15, TARGET + 1):
        run.step(step, loss=math.nan, skipped=True)
    check = MttrOracle(max_steps=5).judge(run.end("failed").evidence())
    assert not check.passed and check.figure is None
    assert "never recovered" in check.detail


def test_mttr_is_not_judged_without_a_fault(tmp_path: Path) -> None:
    check = MttrOracle(max_steps=5).judge(clean_run(tmp_path).evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "no fault was injected" in check.detail


# -- loss_scale_recovered ------------------------------------------------------------------


def fp16_run(run_dir: Path, final_scale: float = 65536.0, late_skip: bool = False) -> Run:
    """An fp16 overflow at step 15: the scale halves twice, skipping, then grows back."""
    run = Run(run_dir).steps(1, 14, loss_scale=65536.0).fault(15, "grad_overflow")
    run.step(15, loss_scale=32768.0, skipped=True).step(16, loss_scale=16384.0, skipped=True)
    run.steps(17, 27, loss_scale=16384.0)
    run.step(28, loss_scale=16384.0, skipped=late_skip)
    return run.steps(29, TARGET, loss_scale=final_scale).end()


def test_loss_scale_recovers(tmp_path: Path) -> None:
    check = LossScaleRecoveredOracle.from_expect(True).judge(fp16_run(tmp_path).evidence())
    assert check.passed, check.detail
    assert check.figure == 1.0 and check.figures["before"] == 65536.0


def test_loss_scale_fails_when_it_collapsed(tmp_path: Path) -> None:
    evidence = fp16_run(tmp_path, final_scale=1.0).evidence()
    check = LossScaleRecoveredOracle(min_fraction=1e-3).judge(evidence)
    assert not check.passed and check.figure == 1.526e-05
    assert "fell from 65536 to 1" in check.detail


def test_loss_scale_fails_on_skips_after_it_should_have_settled(tmp_path: Path) -> None:
    evidence = fp16_run(tmp_path, late_skip=True).evidence()
    oracle = LossScaleRecoveredOracle.from_expect(LossScaleExpect(within_steps=10))
    check = oracle.judge(evidence)
    assert not check.passed and check.figures["late_skips"] == 1
    assert LossScaleRecoveredOracle(within_steps=13).judge(evidence).passed


def test_loss_scale_is_not_judged_on_an_fp32_run(tmp_path: Path) -> None:
    check = LossScaleRecoveredOracle().judge(nan_grad_run(tmp_path).evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "not an fp16 run?" in check.detail


def test_loss_scale_is_not_judged_without_a_fault(tmp_path: Path) -> None:
    evidence = Run(tmp_path).steps(1, TARGET, loss_scale=65536.0).end().evidence()
    check = LossScaleRecoveredOracle().judge(evidence)
    assert check.status == "not judged" and not check.passed
    assert "no fault was injected" in check.detail


# -- max_contamination_consumed ------------------------------------------------------------


def test_no_contamination_consumed(tmp_path: Path) -> None:
    evidence = clean_run(tmp_path, docs=4, contaminated_docs=0).evidence()
    check = ContaminationOracle(bound=0).judge(evidence)
    assert check.passed and check.figure == 0 and check.figures["docs"] == 4 * TARGET


def test_contamination_counts_every_rank_and_redone_step(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).steps(1, 9, docs=4, contaminated_docs=0)
    run.steps(10, 12, docs=4, contaminated_docs=1)  # 2 ranks x 3 steps
    run.rollback(12, to=10).steps(11, TARGET, docs=4, contaminated_docs=0).end()
    check = ContaminationOracle(bound=5).judge(run.evidence())
    assert not check.passed and (check.figure, check.unit) == (6, "docs")


def test_contamination_is_not_judged_when_never_observed(tmp_path: Path) -> None:
    check = ContaminationOracle(bound=0).judge(clean_run(tmp_path).evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "never observed: no step reports contaminated_docs" in check.detail
