"""A sweep's statistics and reports: intervals and tests against known values, cell
summaries from records, and the three report files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.oracles.verdict import Check
from harness.running.results import ScenarioResult
from harness.sweeps.report import write_reports
from harness.sweeps.run_sweep import RunRecord, SweepRun
from harness.sweeps.stats import fisher, holm, mann_whitney, spread, wilson
from harness.sweeps.summary import compare, summarize
from harness.sweeps.sweep_file import parse_sweep


def test_wilson_intervals_match_the_textbook_values() -> None:
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.2775, abs=1e-4)
    assert wilson(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)  # no runs: nothing known


def test_fisher_and_mann_whitney_tell_apart_only_what_differs() -> None:
    # 10/10 against 0/10: p = 2 / C(20, 10).
    assert fisher(10, 10, 0, 10) == pytest.approx(2 / math.comb(20, 10))
    assert fisher(5, 10, 5, 10) == pytest.approx(1.0)
    apart = mann_whitney([1.0, 1.1, 1.2, 1.3, 1.4], [2.0, 2.1, 2.2, 2.3, 2.4])
    assert apart is not None and apart < 0.01
    mixed = mann_whitney([1.0, 2.0, 1.5, 2.5], [1.1, 2.1, 1.6, 2.4])
    assert mixed is not None and mixed > 0.5
    assert mann_whitney([1.0, 2.0], [3.0, 4.0, 5.0]) is None  # too few to compare


def test_holm_corrects_in_order_and_skips_the_untested() -> None:
    assert holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def test_spread_gives_median_and_quartiles() -> None:
    s = spread([4.0, 1.0, 3.0, 2.0, 5.0])
    assert s is not None and (s.median, s.p25, s.p75, s.low, s.high, s.n) == (3, 2, 4, 1, 5, 5)
    assert spread([]) is None


SWEEP = {
    "sweep": "synthetic",
    "description": "records made by hand",
    "scenario": {"trainer": {"steps": 20}, "expect": {"completed": True}},
    "grid": {"optimizer.beta2": [0.999, 0.95]},
    "seeds": 12,
    "min_success": 0.5,
}


def _record(cell: int, seed: int, passed: bool, loss: float | None, error: str | None = None):  # type: ignore[no-untyped-def]
    check = Check("completed", passed, passed, "", "true", "done" if passed else "gave up")
    result = ScenarioResult(
        name=f"cell{cell:02d}-seed{seed}",
        fault_class="numeric",
        weight=1.0,
        checks=[] if error else [check],
        error=error,
        run_seconds=3.0 + seed,
    )
    return RunRecord(cell, seed, f"k{cell}{seed}", result, loss, 0 if error is None else None, "")


def _run(first_passes: int, second_passes: int) -> SweepRun:
    sweep = parse_sweep(SWEEP, "synthetic.yaml")
    records = [_record(1, s, s < first_passes, 4.0 + 0.01 * s) for s in range(12)]
    records += [_record(2, s, s < second_passes, 5.0 + 0.01 * s) for s in range(11)]
    records.append(_record(2, 11, False, None, error="timed out: killed by the watchdog"))
    records[3].final_loss = math.inf  # a finished run that diverged
    return SweepRun(sweep, records, "2026-12-01T00:00:00+00:00", 1.0)


def test_a_cell_summary_counts_successes_errors_and_diverged_losses() -> None:
    first, second = summarize(_run(11, 2))
    assert (first.passed, first.runs, first.errored, first.nonfinite_losses) == (11, 12, 0, 1)
    assert first.final_loss is not None and first.final_loss.n == 11
    assert first.failed_checks == {"completed": 1}
    assert (second.passed, second.errored, second.success) == (2, 1, 2 / 12)
    assert first.meets(0.5) and not second.meets(0.5)
    assert first.interval == pytest.approx(wilson(11, 12))


def test_a_real_difference_is_named_and_a_tie_is_not() -> None:
    run = _run(11, 2)
    (pair,) = compare(run, summarize(run))
    assert pair.success_p < 0.01
    assert "optimizer.beta2=0.999 succeeds more often (92% vs 17%" in pair.note
    assert "optimizer.beta2=0.999 ends at a lower loss" in pair.note
    # Negative control: the same success counts are no difference, whatever the losses.
    tie = _run(6, 6)
    (same,) = compare(tie, summarize(tie))
    assert same.success_p == pytest.approx(1.0)
    assert "succeeds more often" not in same.note


def test_the_reports_hold_the_table_the_tests_and_a_plot_per_metric(tmp_path: Path) -> None:
    paths = write_reports(_run(11, 2), tmp_path)
    assert [p.name for p in paths] == ["sweep.json", "sweep.md", "sweep.html"]
    data = json.loads(paths[0].read_text())  # strict JSON: the infinite loss is a string
    assert [c["passed"] for c in data["cells"]] == [11, 2]
    assert data["complete"] is True and len(data["runs"]) == 24
    assert data["runs"][3]["final_loss"] == "inf"
    md = paths[1].read_text()
    assert "| cell02 | optimizer.beta2=0.95 | 2/12 | 17% (below min) |" in md
    assert "succeeds more often" in md
    html = paths[2].read_text()
    assert html.count("<svg") == 4 and "<script" not in html
    for plot in ("sweep-success", "sweep-loss", "sweep-seconds", "sweep-lost"):
        assert f'id="{plot}"' in html
