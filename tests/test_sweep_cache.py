"""What a sweep keeps in its cache: a run's outcome, never a stop (a stopped run, or a run
whose fault-free baseline was stopped, is run again next time and left out of the table)."""

from __future__ import annotations

from harness.running.baseline import BASELINE_STOPPED
from harness.running.results import ScenarioResult
from harness.running.runner import INTERRUPTED
from harness.sweeps.run_sweep import _keep, _stopped


def result(error: str | None) -> ScenarioResult:
    return ScenarioResult(
        name="cell00-seed0", fault_class="numeric", weight=1.0, checks=[], error=error
    )


def test_a_run_whose_baseline_was_stopped_is_not_kept() -> None:
    stopped = result(f"{BASELINE_STOPPED}\n(the baseline's log tail)")
    assert _stopped(stopped) and not _keep(stopped)
    assert _stopped(result(INTERRUPTED)) and not _keep(result(INTERRUPTED))


def test_a_run_that_failed_on_its_own_is_kept() -> None:
    # The negative control: a crash, or a baseline that failed rather than was stopped,
    # is the configuration's outcome.
    for error in (None, "the trainer exited with code 1", "the fault-free run exited 1"):
        assert _keep(result(error)) and not _stopped(result(error))
