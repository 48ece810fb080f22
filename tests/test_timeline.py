"""The journal queries of `harness.records.timeline`: the one rule for the time to
recover, on hand-made journals whose answer is known."""

from __future__ import annotations

from pathlib import Path

from harness.records.journal import Event
from harness.records.timeline import recovery

from .oracle_runs import TARGET, Run


def _events(run: Run) -> list[Event]:
    return list(run.evidence().journal)


def _fault_at(events: list[Event]) -> int:
    return next(i for i, e in enumerate(events) if e.kind == "fault_injected")


def test_recovery_after_a_rollback(tmp_path: Path) -> None:
    # A spike at 25, detected at 26, rolled back to the save of step 20, trained on.
    run = Run(tmp_path).steps(1, 24).fault(25, "lr_spike").step(25).step(26, loss=40.0)
    run.detect(26, "robust_zscore").rollback(26, to=20).steps(21, TARGET).end()
    events = _events(run)
    at = _fault_at(events)
    # The soak's time: back past the fault's step 25 (step 26 redone), after the rollback.
    regained = recovery(events, at)
    assert regained.last_sign.kind == "recovered"
    assert regained.back is not None and regained.back.step == 26
    # Steps 25 and 26, then 21..26 redone: 8 steps of rank 0 from the fault to it, less one.
    assert regained.steps == 7
    assert regained.seconds == regained.back.wall - events[at].wall
    # The mttr check's time: the first good step after the rollback, step 21 redone.
    resumed = recovery(events, at, past_fault=False)
    assert resumed.back is not None and resumed.back.step == 21 and resumed.steps == 2


def test_a_sign_after_the_window_is_not_counted(tmp_path: Path) -> None:
    # A skipped step at 15, then a second fault at 20 whose own skip the first must not wait for.
    run = Run(tmp_path).steps(1, 14).fault(15).step(15, skipped=True).steps(16, 19)
    run.fault(20).step(20, skipped=True).steps(21, TARGET).end()
    events = _events(run)
    first, second = (i for i, e in enumerate(events) if e.kind == "fault_injected")
    timed = recovery(events, first, until=second)
    assert timed.back is not None and timed.back.step == 16 and timed.steps == 1
    unbounded = recovery(events, first)
    assert unbounded.back is not None and unbounded.back.step == 21


def test_a_run_that_never_recovers(tmp_path: Path) -> None:
    run = Run(tmp_path).steps(1, 14).fault(15)
    for step in range(15, TARGET + 1):
        run.step(step, loss=float("nan"), skipped=True)
    events = _events(run.end("failed"))
    timed = recovery(events, _fault_at(events))
    assert timed.back is None and timed.seconds is None and timed.steps is None
    assert timed.last_sign.kind == "step" and timed.last_sign.step == TARGET
