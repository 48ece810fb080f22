"""The smoke suite end to end: the reference trainer passes every check, and the fragile preset
fails exactly the checks its missing mechanisms cover."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from harness.running.results import SuiteResult
from harness.running.runner import RunOptions, run_suite
from harness.scorecard import compare, load_scorecard
from harness.scorecard.render import render_comparison, write_scorecards
from harness.suites.suite_loader import load_suite

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "scenarios" / "smoke.yaml"

#: What switching every mechanism off must break, scenario by scenario.
FRAGILE_FAILS = {
    # no NaN guard: the update goes through, the weights turn NaN
    "nan-grad": ("failed", {"detected", "params_finite", "final_loss_within"}),
    # no spike detectors: nothing notices, nothing rolls back, the loss stays ruined
    "lr-spike": ("failed", {"detected", "final_loss_within"}),
    # no integrity check and no fallback: the unreadable checkpoint is reported, but the
    # trainer has nothing else to load and stops; its report is a word with no deed behind
    # it (nothing else loaded, no restart), and no load happened that could be checked
    "truncated-checkpoint": ("error", {"completed", "detected", "no_corrupt_checkpoint_loaded"}),
    # no dedup: the copies reach the model
    "duplicate-data": ("failed", {"max_contamination_consumed"}),
    # no restarts: the lost process takes the job with it
    "node-loss": ("error", {"detected", "completed", "mttr"}),
}


#: The two scenarios of the smoke suite that share a fault-free run.
PAIR = ["nan-grad", "lr-spike"]


def run(tmp_path: Path, preset: str) -> SuiteResult:
    options = RunOptions(
        out_dir=tmp_path / preset, preset=preset, cache_dir=tmp_path / "cache", cores=2
    )
    result = run_suite(load_suite(SMOKE), options, progress=False)
    write_scorecards(result, options.out_dir)
    return result


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("smoke")


@pytest.fixture(scope="module")
def robust(smoke_dir: Path) -> SuiteResult:
    """The smoke suite on the reference trainer, from an empty cache, two scenarios at a
    time (so nan-grad and lr-spike start together and share one fresh baseline)."""
    return run(smoke_dir, "reference")


@pytest.mark.slow
def test_smoke_separates_the_reference_trainer_from_the_fragile_one(
    robust: SuiteResult, smoke_dir: Path
) -> None:
    report = {
        r.name: [(c.name, c.figure, c.detail) for c in r.failed_checks] for r in robust.scenarios
    }
    assert robust.passed and robust.score == 100.0, report
    classes = {r.fault_class for r in robust.scenarios}
    assert classes == {"numeric", "loss_spike", "checkpoint", "data", "process"}
    # Every run recorded its microscope, and the page draws each one's gradient flow,
    # update ratios and activation histograms (tests/test_scorecard_microscope.py: what).
    page = (smoke_dir / "reference" / "scorecard.html").read_text()
    views = Counter(re.findall(r'<figure [^>]*id="micro-[\w-]+-(grad|update|act)"', page))
    assert views == {view: len(robust.scenarios) for view in ("grad", "update", "act")}

    fragile = run(smoke_dir, "fragile")
    outcome = {r.name: (r.status, {c.name for c in r.failed_checks}) for r in fragile.scenarios}
    assert outcome == FRAGILE_FAILS
    assert not fragile.passed and fragile.score < 60
    crashed = next(r for r in fragile.scenarios if r.status == "error")
    assert "state.pt" in crashed.log_tail  # the report carries the trainer's last words

    # Side by side, as the demo prints them: every class dropped, each broken check named.
    text = render_comparison(compare(robust, fragile))
    assert "| fault class | reference | fragile |" in text and "verdict: REGRESSED" in text
    assert "max_contamination_consumed" in text and "params_finite" in text

    # Both scorecards load back with the same verdicts.
    again = load_scorecard(smoke_dir / "fragile")
    assert again.score == fragile.score
    assert [r.status for r in again.scenarios] == [r.status for r in fragile.scenarios]


@pytest.mark.slow
def test_parallel_scenarios_sharing_a_baseline_give_the_same_verdicts_every_time(
    robust: SuiteResult, tmp_path: Path
) -> None:
    # nan-grad and lr-spike compare with the same fault-free run: with two cores they
    # start together and both wait for it (they once raced copying it and scored 77.8).
    # Two attempts, each with its own cache (so each builds and shares a fresh baseline),
    # show the verdicts are the same each time: the smoke run above, and this one.
    def verdicts(result: SuiteResult) -> set[tuple[str, str, str]]:
        pair = [r for r in result.scenarios if r.name in PAIR]
        failed = {r.name: r.error or [(c.name, c.figure, c.detail) for c in r.failed_checks]
                  for r in pair if r.score < 1}  # fmt: skip
        assert len(pair) == 2 and not failed, failed
        return {(r.name, c.name, c.status) for r in pair for c in r.checks}

    options = RunOptions(out_dir=tmp_path / "out", cache_dir=tmp_path / "cache", cores=2)
    again = run_suite(load_suite(SMOKE), options, select=PAIR, progress=False)
    assert verdicts(again) == verdicts(robust)
