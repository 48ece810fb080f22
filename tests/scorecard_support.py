"""A small suite's results with synthetic journals, for the scorecard tests (no trainer runs)."""

from __future__ import annotations

import math
from pathlib import Path

from harness.oracles.verdict import Check
from harness.records.journal import JournalWriter
from harness.running.results import ScenarioResult, SuiteResult

#: What the failing check measured: the tests look for it in every rendering.
FAILED_FIGURE = 12
LOG_TAIL = "step 7: loading checkpoint step-00000005\nRuntimeError: checkpoint shard 3 is corrupt"


def write_journal(
    run_dir: Path,
    *,
    steps: int = 30,
    fault_at: int | None = None,
    rollback: tuple[int, int] | None = None,
    fp16: bool = False,
) -> None:
    """A rank-0 journal of ``steps`` steps: a NaN gradient at ``fault_at`` (skipped and
    detected), or a crash at ``rollback[0]`` resumed from the checkpoint of ``rollback[1]``."""
    order = list(range(1, steps + 1))
    if rollback is not None:
        crash, resume = rollback
        order = list(range(1, crash + 1)) + list(range(resume + 1, steps + 1))
    with JournalWriter(run_dir) as w:
        w.emit("run_start", 0, world_size=1, pid=1, host="test", target_steps=steps)
        restarted = False
        for n, step in enumerate(order):
            if rollback is not None and not restarted and n > 0 and step <= order[n - 1]:
                restarted = True
                w.emit("detected", order[n - 1], detector="heartbeat")
                w.emit("restart", order[n - 1], count=1, reason="rank 0 exited")
                w.emit("checkpoint_loaded", step - 1, path=f"ckpt/step-{step - 1}")
            if step == fault_at:
                w.emit("fault_injected", step, fault="nan_grad", target="*")
                w.emit("detected", step, detector="nonfinite_grad")
            bad = step == fault_at
            loss = 6.0 * math.exp(-step / 25) + 0.05 * math.sin(step) + (0.3 if restarted else 0)
            w.emit(
                "step",
                step,
                loss=loss,
                grad_norm=math.nan if bad else 1.0 + 0.4 * math.cos(step / 3),
                loss_scale=(2.0**16 if step < (fault_at or steps + 1) else 2.0**15)
                if fp16
                else None,
                skipped=bad,
            )
            if bad:
                w.emit("recovered", step, action="skip_step")
        w.emit("run_end", steps, status="completed", seconds=1.0)


def make_suite(card_dir: Path) -> SuiteResult:
    """Three scenarios, one each passed, failed and errored, their journals under card_dir."""
    write_journal(card_dir / "runs" / "baseline", fp16=True)
    write_journal(card_dir / "runs" / "nan-grad", fault_at=15, fp16=True)
    write_journal(card_dir / "runs" / "crash-resume", rollback=(18, 10))
    write_journal(card_dir / "runs" / "crash-baseline")
    passed = ScenarioResult(
        name="nan-grad",
        fault_class="numeric",
        weight=1.0,
        description="A NaN gradient at step 15 is caught and the step skipped.",
        checks=[
            Check("detect_latency", True, 0, "steps", "<= 1 steps", "Detected at once."),
            Check("params_finite", True, True, "", "true", "Every parameter stayed finite."),
        ],
        seconds=3.2,
        run_dir="runs/nan-grad",
        baseline_dir="runs/baseline",
    )
    failed = ScenarioResult(
        name="crash-resume",
        fault_class="process",
        weight=2.0,
        description="Rank 0 is killed at step 18 and must resume <from> the last checkpoint.",
        checks=[
            Check(
                "recovery_latency",
                False,
                FAILED_FIGURE,
                "steps",
                "<= 5 steps",
                "Training resumed 12 steps after the crash, 7 more than allowed.",
                figures={"seconds": 4.5, "lost_steps": 8},
            ),
            Check("loss_gap", True, 0.012, "relative", "<= 0.05", "Final loss near baseline."),
        ],
        log_tail="step 18: killed by SIGKILL",
        seconds=61.0,
        run_dir="runs/crash-resume",
        baseline_dir="runs/crash-baseline",
    )
    errored = ScenarioResult(
        name="corrupt-checkpoint",
        fault_class="checkpoint",
        weight=1.0,
        checks=[],
        error="trainer exited with code 1 before step 8",
        log_tail=LOG_TAIL,
        seconds=2.0,
        run_dir="runs/missing",
    )
    return SuiteResult(
        suite="smoke",
        preset="tiny",
        scenarios=[passed, failed, errored],
        started="2025-01-01T12:00:00Z",
        seconds=66.2,
        min_score=80.0,
        version="0.1.0",
    )
