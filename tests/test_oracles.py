"""Oracles of detection and health: each passes on a run that earns it and fails on one
that does not (its negative control), and none raises on odd evidence."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.oracles import (
    ORACLES,
    CompletedOracle,
    DetectedOracle,
    FalseAlarmsOracle,
    FinalLossOracle,
    ParamsFiniteOracle,
    build_oracles,
    judge,
)
from harness.oracles.base import rounded
from harness.oracles.detection import DetectedExpect
from harness.oracles.verdict import Evidence
from harness.records.journal import Journal
from harness.records.timeline import corroborated, faults
from harness.suites.scenario import Expect

from .oracle_runs import TARGET, Run, clean_run, nan_grad_run

# -- detected ------------------------------------------------------------------------------


def test_detected_passes_with_latency_and_detector(tmp_path: Path) -> None:
    check = DetectedOracle(within_steps=0, detectors=("nonfinite_guard",)).judge(
        nan_grad_run(tmp_path).evidence()
    )
    assert check.passed, check.detail
    assert (check.figure, check.unit) == (0, "steps")
    assert check.figures["detector"] == "nonfinite_guard"
    assert isinstance(check.figures["seconds"], float) and check.figures["seconds"] >= 0
    assert check.expected == "detected within 0 steps by nonfinite_guard"


def test_detected_fails_when_nothing_detects_the_fault(tmp_path: Path) -> None:
    run = Run(tmp_path).steps(1, 14).fault(15).step(15, loss=math.nan).steps(16, TARGET).end()
    check = DetectedOracle().judge(run.evidence())
    assert not check.passed and check.figure is None
    assert "nan_grad at step 15 was never detected" in check.detail


def test_detected_fails_when_too_late(tmp_path: Path) -> None:
    run = Run(tmp_path).steps(1, 14).fault(15).steps(15, 17).step(18, skipped=True)
    run.detect(18, "robust_zscore")
    check = DetectedOracle(within_steps=2).judge(run.steps(19, TARGET).end().evidence())
    assert not check.passed
    assert check.figure == 3 and check.figures["detection_step"] == 18
    assert "too late" in check.detail


def test_detected_counts_only_the_named_detectors(tmp_path: Path) -> None:
    evidence = nan_grad_run(tmp_path).evidence()
    check = DetectedOracle(detectors=("robust_zscore", "forecast")).judge(evidence)
    assert not check.passed
    assert "only nonfinite_guard, skipped_step fired" in check.detail


def test_a_detection_before_the_fault_does_not_count(tmp_path: Path) -> None:
    run = Run(tmp_path).steps(1, 5).detect(5, "robust_zscore").steps(6, 14).fault(15)
    check = DetectedOracle().judge(run.steps(15, TARGET).end().evidence())
    assert not check.passed


def test_rejected_checkpoints_and_lost_ranks_count_as_detections(tmp_path: Path) -> None:
    run = Run(tmp_path).steps(1, 20).fault(20, "bitflip_file", target="ckpt/state.pt")
    run.steps(21, 22).emit("checkpoint_rejected", 22, path="ckpt", reason="hash mismatch")
    run.emit("rank_lost", 23, lost_rank=1)
    evidence = run.restart(resume_at=15).steps(16, TARGET).end().evidence()
    integrity = DetectedOracle(within_steps=2, detectors=("checkpoint_integrity",))
    assert integrity.judge(evidence).passed
    lost = DetectedOracle(detectors=("rank_lost",)).judge(evidence)
    assert lost.passed and lost.figure == 3


def test_a_claim_with_nothing_behind_it_is_not_a_detection(tmp_path: Path) -> None:
    # The trainer says "detected" but skips nothing, rolls nothing back, never restarts.
    run = Run(tmp_path).steps(1, 14).fault(15).steps(15, 16).detect(16, "nonfinite_guard")
    check = DetectedOracle().judge(run.steps(17, TARGET).end().evidence())
    assert check.status == "failed"
    assert "the trainer claimed nonfinite_guard, but nothing it did shows it" in check.detail


def test_an_update_with_gradients_the_agent_saw_repaired_is_a_detection(tmp_path: Path) -> None:
    repaired = Run(tmp_path / "repaired").steps(1, 14).fault(15).step(15, grads_repaired=True)
    repaired.detect(15, "nonfinite_guard")
    check = DetectedOracle(within_steps=0).judge(repaired.steps(16, TARGET).end().evidence())
    assert check.passed and check.figures["detector"] in ("gradient_repaired", "nonfinite_guard")
    # Negative control: the same claim, the step neither skipped nor repaired.
    bare = Run(tmp_path / "bare").steps(1, 14).fault(15).step(15).detect(15, "nonfinite_guard")
    check = DetectedOracle(within_steps=0).judge(bare.steps(16, TARGET).end().evidence())
    assert not check.passed


def test_what_the_trainer_did_is_a_detection_without_any_claim(tmp_path: Path) -> None:
    skip = Run(tmp_path / "skip").steps(1, 14).fault(15).step(15, skipped=True)
    check = DetectedOracle(within_steps=0).judge(skip.steps(16, TARGET).end().evidence())
    assert check.passed and check.figures["detector"] == "skipped_step"
    again = Run(tmp_path / "again").steps(1, 14).fault(15).steps(15, 17).steps(11, TARGET)
    check = DetectedOracle(detectors=("rollback",)).judge(again.end().evidence())
    assert check.passed and check.figures["detection_step"] == 11
    restart = Run(tmp_path / "restart").steps(1, 14).fault(15, "kill").steps(15, 16)
    check = DetectedOracle().judge(restart.restart(10).steps(11, TARGET).end().evidence())
    assert check.passed and check.figures["detector"] == "restart"


def test_a_refused_file_is_a_checkpoint_integrity_detection(tmp_path: Path) -> None:
    snap, prev = str(tmp_path / "snapshot.pt"), str(tmp_path / "snapshot.pt.prev")
    raised = Run(tmp_path / "raised").steps(1, 16).fault(16, "truncate", file=snap)
    raised.emit("file_load_failed", 16, path=snap, sha256="b", error="EOFError: x")
    raised.emit("file_loaded", 16, path=prev, sha256="a", intact=True)
    detected = DetectedOracle(detectors=("checkpoint_integrity",))
    assert detected.judge(raised.steps(17, TARGET).end().evidence()).passed
    # An intact older file of its own loaded while the damaged one was there: refused too.
    older = Run(tmp_path / "older").steps(1, 16).fault(16, "bitflip_file", file=snap)
    older.emit("file_loaded", 16, path=prev, sha256="a", intact=True)
    assert detected.judge(older.steps(17, TARGET).end().evidence()).passed
    # Loading the damaged file itself is no refusal (negative control).
    took = Run(tmp_path / "took").steps(1, 16).fault(16, "bitflip_file", file=snap)
    took.emit("file_loaded", 16, path=snap, sha256="c", intact=False)
    assert not detected.judge(took.steps(17, TARGET).end().evidence()).passed
    # Nor is loading it beside the intact rest of its checkpoint (a Hugging Face folder:
    # the damaged weights, an intact optimizer.pt).
    beside = Run(tmp_path / "beside").steps(1, 16).fault(16, "bitflip_file", file=snap)
    beside.emit("file_loaded", 16, path=snap, sha256="c", intact=False)
    beside.emit("file_loaded", 16, path=str(tmp_path / "optimizer.pt"), sha256="d", intact=True)
    assert not detected.judge(beside.steps(17, TARGET).end().evidence()).passed


def test_a_claim_counts_only_beside_the_response_that_answers_its_fault(tmp_path: Path) -> None:
    forecast = DetectedOracle(detectors=("forecast",))
    # The step the claim names is skipped: the claim is backed.
    backed = Run(tmp_path / "backed").steps(1, 14).fault(15).step(15, skipped=True)
    check = forecast.judge(backed.detect(15, "forecast").steps(16, TARGET).end().evidence())
    assert check.passed and check.figures["detection_step"] == 15
    # Negative control: nothing answers the claim; a skip ten steps on answers something else.
    later = Run(tmp_path / "later").steps(1, 14).fault(15).steps(15, 16).detect(16, "forecast")
    later.steps(17, 24).step(25, skipped=True).steps(26, TARGET).end()
    check = forecast.judge(later.evidence())
    assert check.status == "failed"
    assert "the trainer claimed forecast, but no observed response to the fault backs it" in (
        check.detail
    )


def test_a_response_to_another_fault_backs_no_claim_about_the_first(tmp_path: Path) -> None:
    run = Run(tmp_path).steps(1, 14).fault(15, plan_index=0).steps(15, 16)
    run.fault(17, "lr_spike", plan_index=1).step(17, skipped=True).detect(17, "forecast")
    evidence = run.steps(18, TARGET).end().evidence()
    check = DetectedOracle().judge(evidence)
    assert check.status == "failed" and "nan_grad at step 15 was never detected" in check.detail
    # The same claim and skip do answer the fault they follow.
    second = faults(evidence.journal)[1]
    counted, words = corroborated(evidence.journal, second)
    assert {d.detector for d in counted} == {"skipped_step", "forecast"} and not words


def test_a_rollback_long_after_the_answer_is_not_the_answer(tmp_path: Path) -> None:
    # The guard skips the faulted step; eight calm steps later something else rolls back.
    run = Run(tmp_path).steps(1, 14).fault(15).step(15, skipped=True).steps(16, 22)
    run.detect(22, "robust_zscore").rollback(22, to=17).steps(18, TARGET).end()
    evidence = run.evidence()
    assert DetectedOracle(within_steps=0).judge(evidence).passed
    for late in ("rollback", "robust_zscore"):
        check = DetectedOracle(detectors=(late,)).judge(evidence)
        assert check.status == "failed", late


def test_detected_is_not_judged_when_no_fault_was_injected(tmp_path: Path) -> None:
    check = DetectedOracle().judge(clean_run(tmp_path).evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "no fault was injected" in check.detail


# -- max_false_alarms ----------------------------------------------------------------------


def test_false_alarms_pass_on_a_quiet_baseline(tmp_path: Path) -> None:
    faulted = nan_grad_run(tmp_path / "faulted")
    baseline = clean_run(tmp_path / "baseline")
    check = FalseAlarmsOracle(bound=0).judge(faulted.evidence(baseline))
    assert check.passed and check.figure == 0


def test_false_alarms_fail_on_a_detection_in_the_baseline(tmp_path: Path) -> None:
    baseline = Run(tmp_path / "baseline").steps(1, 10).detect(10, "robust_zscore")
    baseline.emit("checkpoint_rejected", 11, path="p", reason="r").steps(11, TARGET).end()
    check = FalseAlarmsOracle(bound=1).judge(clean_run(tmp_path / "run").evidence(baseline))
    assert not check.passed and check.figure == 2
    assert check.figures["detectors"] == "checkpoint_integrity, robust_zscore"


def test_false_alarms_are_not_judged_without_a_baseline(tmp_path: Path) -> None:
    check = FalseAlarmsOracle().judge(clean_run(tmp_path).evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "no fault-free baseline" in check.detail


def test_false_alarms_are_not_judged_on_a_baseline_that_never_trained(tmp_path: Path) -> None:
    # Silence from a run that took no step is no evidence of a quiet detector.
    baseline = Run(tmp_path / "baseline").end("failed", step=0)
    check = FalseAlarmsOracle().judge(clean_run(tmp_path / "run").evidence(baseline))
    assert check.status == "not judged" and not check.passed
    assert "reported no step" in check.detail


# -- params_finite -------------------------------------------------------------------------


def test_params_finite_passes_when_every_observation_is_finite(tmp_path: Path) -> None:
    check = ParamsFiniteOracle().judge(nan_grad_run(tmp_path).evidence())
    assert check.passed and check.figure == 0 and check.figures["observations"] == TARGET


def test_params_finite_fails_on_one_non_finite_observation_on_any_rank(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).steps(1, 10, params_finite=True)
    run.emit("step", 11, rank=1, loss=1.0, params_finite=False)
    check = ParamsFiniteOracle().judge(run.end().evidence())
    assert not check.passed and check.figure == 1
    assert "rank 1 at step 11" in check.detail


def test_params_finite_fails_when_the_run_ends_on_an_unguarded_nan(tmp_path: Path) -> None:
    # The trainer's weights are poisoned although no observation after it says so.
    run = Run(tmp_path).steps(1, 29, params_finite=True).step(30, loss=math.inf)
    check = ParamsFiniteOracle().judge(run.end().evidence())
    assert not check.passed and check.figures["first_bad_step"] == 30


def test_params_finite_says_in_words_the_counts_its_figures_give(tmp_path: Path) -> None:
    # Two looks saw non-finite weights; the last step's NaN loss, applied unchecked, is a
    # third sign of them but no third observation.
    run = Run(tmp_path).steps(1, 19).step(20, loss=1.0, params_finite=False).steps(21, 29)
    check = ParamsFiniteOracle().judge(
        run.step(30, loss=math.nan).end(params_finite=False).evidence()
    )
    assert (check.figure, check.figures["observations"]) == (3, 2)
    assert check.detail == (
        "3 signs of non-finite weights (2 of 2 observations saw them, 1 last step that applied "
        "a non-finite loss), the first on rank 0 at step 20"
    )
    only = Run(tmp_path / "only").steps(1, 9, params_finite=True)
    only.step(10, loss=1.0, params_finite=False).steps(11, TARGET, params_finite=True)
    check = ParamsFiniteOracle().judge(only.end().evidence())
    assert check.figure == 1
    assert (
        check.detail
        == "1 of 30 observations saw non-finite weights, the first on rank 0 at step 10"
    )


def test_params_finite_is_not_judged_when_never_observed(tmp_path: Path) -> None:
    check = ParamsFiniteOracle().judge(Run(tmp_path).steps(1, TARGET).end().evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "never observed" in check.detail


def test_params_finite_fails_on_an_unguarded_nan_even_without_observations(
    tmp_path: Path,
) -> None:
    # The loss alone shows the weights were poisoned: evidence enough to fail.
    run = Run(tmp_path).steps(1, 29).step(30, loss=math.nan)
    check = ParamsFiniteOracle().judge(run.end().evidence())
    assert check.status == "failed" and check.figure == 1
    assert check.figures["first_bad_step"] == 30


# -- completed -----------------------------------------------------------------------------


def test_completed_passes_after_a_restart(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).steps(1, 12).end("failed", step=12, reason="killed")
    run.restart(resume_at=10).steps(11, TARGET).end()
    check = CompletedOracle().judge(run.evidence())
    assert check.passed, check.detail
    assert check.figure == TARGET and check.figures["restarts"] == 1


def test_completed_judges_the_last_launch_when_a_resumed_job_numbers_restarts_anew(
    tmp_path: Path,
) -> None:
    # The first launch restarted once, then stopped as asked; the second (a rescheduled
    # job, resumed) counts its restarts from 0 again and trains to the target.
    run = Run(tmp_path).steps(1, 5).end("failed", step=5, reason="recovery exhausted")
    run.restart(resume_at=0).steps(1, 20).end("stopped", step=20, reason="stopped as asked")
    run.restart_count = -1
    run.restart(resume_at=20).steps(21, TARGET).end()
    check = CompletedOracle().judge(run.evidence())
    assert check.passed, check.detail
    stopped = Run(tmp_path / "stopped").steps(1, 5).end("failed", step=5)
    stopped.restart(resume_at=0).steps(1, 20).end("stopped", step=20)
    stopped.restart_count = -1
    stopped.restart(resume_at=20).steps(21, TARGET)  # the resumed launch wrote no run_end
    check = CompletedOracle().judge(stopped.evidence())
    assert not check.passed and "rank 0 wrote no run_end" in check.detail, check.detail


def test_completed_fails_naming_each_missing_piece(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).steps(1, 20)
    run.emit("run_end", 20, rank=0, status="failed", reason="NaN loss")
    check = CompletedOracle().judge(run.evidence(exit_code=1))
    assert not check.passed and check.figure == 20
    for piece in (
        "exited with code 1",
        "step 20 of 30",
        "rank 0 ended failed (NaN loss)",
        "rank 1 wrote no run_end",
    ):
        assert piece in check.detail


def test_completed_fails_when_killed_at_the_deadline(tmp_path: Path) -> None:
    check = CompletedOracle().judge(clean_run(tmp_path).evidence(exit_code=None))
    assert not check.passed and "killed at its deadline" in check.detail


def test_completed_is_not_judged_on_a_clean_exit_with_an_empty_journal(tmp_path: Path) -> None:
    evidence = Evidence(journal=Journal([]), run_dir=tmp_path, target_steps=TARGET, exit_code=0)
    check = CompletedOracle().judge(evidence)
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "the journal is empty" in check.detail


def test_completed_fails_on_a_failed_exit_even_with_an_empty_journal(tmp_path: Path) -> None:
    evidence = Evidence(journal=Journal([]), run_dir=tmp_path, target_steps=TARGET, exit_code=1)
    check = CompletedOracle().judge(evidence)
    assert check.status == "failed" and "exited with code 1" in check.detail


# -- final_loss_within ---------------------------------------------------------------------


def test_final_loss_passes_near_the_baseline(tmp_path: Path) -> None:
    baseline = clean_run(tmp_path / "baseline")
    check = FinalLossOracle(tolerance=0.05).judge(nan_grad_run(tmp_path / "run").evidence(baseline))
    assert check.passed and check.figure == 0.0 and check.unit == "relative"


def test_final_loss_fails_far_from_the_baseline(tmp_path: Path) -> None:
    baseline = clean_run(tmp_path / "baseline")
    run = Run(tmp_path / "run").steps(1, 25).steps(26, TARGET, loss=8.0).end()
    check = FinalLossOracle(tolerance=0.05).judge(run.evidence(baseline))
    assert not check.passed
    base = sum(5.0 - 0.02 * s for s in range(26, 31)) / 5
    assert check.figure == rounded(abs(8.0 - base) / base)


def test_final_loss_fails_on_a_nan_loss(tmp_path: Path) -> None:
    baseline = clean_run(tmp_path / "baseline")
    run = Run(tmp_path / "run").steps(1, 29).step(30, loss=math.nan).end()
    check = FinalLossOracle(tolerance=10).judge(run.evidence(baseline))
    assert not check.passed and check.figure == "nan"


def test_final_loss_is_not_judged_without_a_baseline(tmp_path: Path) -> None:
    check = FinalLossOracle().judge(clean_run(tmp_path).evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "no fault-free baseline" in check.detail


def test_final_loss_is_not_judged_when_the_run_reported_no_loss(tmp_path: Path) -> None:
    baseline = clean_run(tmp_path / "baseline")
    run = Run(tmp_path / "run").end("failed", step=0)
    check = FinalLossOracle().judge(run.evidence(baseline))
    assert check.status == "not judged" and not check.passed
    assert "the faulted run reported no step on rank 0" in check.detail


# -- building and judging ------------------------------------------------------------------


def test_every_expect_field_has_its_oracle() -> None:
    assert list(ORACLES) == list(Expect.model_fields)


def test_build_oracles_follows_the_checks_asked_for() -> None:
    expect = Expect(
        max_false_alarms=0,
        detected=DetectedExpect(within_steps=3, detector=["nonfinite_guard", "rollback"]),
        completed=True,
        params_finite=False,
    )
    oracles = build_oracles(expect)
    assert (
        [o.name for o in oracles]
        == expect.checks()
        == ["detected", "completed", "max_false_alarms"]
    )
    assert oracles[0] == DetectedOracle(within_steps=3, detectors=("nonfinite_guard", "rollback"))
    assert oracles[2] == FalseAlarmsOracle(bound=0)


def _ask_everything() -> Expect:
    return Expect(
        detected=True,
        params_finite=True,
        completed=True,
        final_loss_within=0.1,
        max_lost_steps=0,
        mttr={"max_steps": 1},
        no_corrupt_checkpoint_loaded=True,
        max_contamination_consumed=0,
        max_false_alarms=0,
        loss_scale_recovered=True,
        max_fallback_rate=0.01,
        max_toxic_consumed=0,
        replicas_consistent=True,
        max_phrase_collapse={"k": 8},
        kept_params_finite=True,
        max_stall_seconds=60,
        no_processes_left=True,
        culprit_named=True,
        # The synthetic runs are written at the CPU's pace: any ratio of paces is noise.
        max_slowdown=1e6,
    )


def test_judge_never_raises_on_an_empty_journal(tmp_path: Path) -> None:
    evidence = Evidence(journal=Journal([]), run_dir=tmp_path, target_steps=10, exit_code=None)
    checks = judge(_ask_everything(), evidence)
    assert [c.name for c in checks] == list(ORACLES)
    # No evidence passes nothing; the only thing known is that the run was killed.
    assert not any(c.passed for c in checks)
    assert {c.name: c.status for c in checks if c.status != "not judged"} == {"completed": "failed"}
    assert all(c.detail and "the oracle failed" not in c.detail for c in checks)


def test_judge_on_a_handled_fault(tmp_path: Path) -> None:
    evidence = nan_grad_run(tmp_path / "run").evidence(clean_run(tmp_path / "baseline"))
    verdicts = {c.name: c.status for c in judge(_ask_everything(), evidence)}
    assert verdicts == {
        "detected": "passed",
        "params_finite": "passed",
        "completed": "passed",
        "final_loss_within": "passed",
        "max_lost_steps": "failed",  # the skipped step is lost
        "mttr": "passed",
        "no_corrupt_checkpoint_loaded": "not judged",  # the run never loaded a checkpoint
        "max_contamination_consumed": "not judged",  # the synthetic steps report no docs
        "max_false_alarms": "passed",
        "loss_scale_recovered": "not judged",  # an fp32 run
        "max_fallback_rate": "not judged",  # the synthetic steps report no token counts
        "max_toxic_consumed": "not judged",  # no step reports contaminated_kinds
        "replicas_consistent": "not judged",  # one rank
        "max_phrase_collapse": "not judged",  # no phrase planted, no generations
        "kept_params_finite": "passed",
        "max_stall_seconds": "passed",
        "no_processes_left": "not judged",  # a synthetic run: no launcher looked
        "culprit_named": "failed",  # the fault hit rank 0 and no rank was named
        "max_slowdown": "passed",
    }


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.123456, 0.1235),
        (123456.7, 123500.0),
        (65536.0, 65536.0),
        (math.inf, "inf"),
        (math.nan, "nan"),
        (7, 7),
    ],
)
def test_figures_keep_four_digits_or_whole_numbers(value: float, shown: object) -> None:
    assert rounded(value) == shown


def test_params_finite_counts_the_last_look_at_the_end_of_the_run(tmp_path: Path) -> None:
    # Steps unchecked (an attached agent looks every 50 steps), the run's end looked.
    clean = Run(tmp_path / "clean").steps(1, TARGET).end(params_finite=True)
    check = ParamsFiniteOracle().judge(clean.evidence())
    assert check.passed and check.figures["observations"] == 1
    nan = Run(tmp_path / "nan").steps(1, TARGET).end(params_finite=False)
    assert not ParamsFiniteOracle().judge(nan.evidence()).passed
