"""The scorecard's coverage: fault kinds x the trainer mechanisms each ran against (from the
specs saved with the results), command trainers as unknown, and the checklist's counts."""

from __future__ import annotations

import re
from pathlib import Path

from harness.checklist.catalogue import catalogue
from harness.mechanisms import MECHANISMS, OPT_IN
from harness.running.results import SuiteResult
from harness.scorecard.coverage import COLUMNS, coverage
from harness.scorecard.render import render_html, render_markdown
from harness.suites.scenario import Scenario
from tests.scorecard_support import make_suite

#: What the journals of `make_suite`'s two recorded runs emit, by hand from
#: tests/scorecard_support.write_journal (run_start, steps with loss, gradient norm, loss
#: scale and skipped, a fault, a restart, a checkpoint restored, run_end).
EMITTED_BY_MAKE_SUITE = {
    "world-size",
    "training-loss",
    "global-grad-norm",
    "fp16-loss-scale",
    "skipped-steps",
    "faults-injected",
    "restarts",
    "checkpoint-restored",
    "run-end-status",
}


def _spec(name: str, faults: list[dict[str, object]], trainer: dict[str, object]) -> dict:
    scenario = Scenario.model_validate(
        {"name": name, "faults": faults, "trainer": trainer, "expect": {"completed": True}}
    )
    return scenario.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def suite_with_specs(card_dir: Path) -> SuiteResult:
    """make_suite's three results, with specs: NaN gradients against the reference trainer
    without surgery, a kill against the fragile preset, a hang against a command trainer."""
    result = make_suite(card_dir)
    passed, failed, errored = result.scenarios
    passed.spec = _spec(
        "nan-grad",
        [{"kind": "nan_grad", "at_step": 15}],
        {"disable": ["surgery"], "enable": ["forecast_acting"]},
    )
    failed.spec = _spec("crash-resume", [{"kind": "kill", "at_step": 18}], {"preset": "fragile"})
    errored.spec = _spec(
        "corrupt-checkpoint",
        [{"kind": "hang", "at_step": 5}, {"kind": "nan_grad", "at_step": 6}],
        {"command": "{python} train.py"},
    )
    return result


def test_fault_kinds_are_counted_against_the_mechanisms_they_ran_with(tmp_path: Path) -> None:
    cov = coverage(suite_with_specs(tmp_path))
    rows = {row.kind: row for row in cov.rows}
    assert list(rows) == ["nan_grad", "kill", "hang"]  # the registry's order
    nan = rows["nan_grad"]
    assert (nan.scenarios, nan.unknown) == (2, 1)
    assert nan.on["nonfinite_guard"] == 1 and nan.on["forecast_acting"] == 1
    assert "surgery" not in nan.on and "quality_sampling" not in nan.on
    # The fragile preset switches everything off, restarts included.
    assert rows["kill"].scenarios == 1 and rows["kill"].on == {}
    assert rows["hang"].unknown == 1 and rows["hang"].on == {}
    assert any("command trainer" in note for note in cov.notes)
    assert set(COLUMNS) == set(MECHANISMS) | set(OPT_IN)


def test_checklist_counts_come_from_the_kinds_and_the_runs(tmp_path: Path) -> None:
    result = suite_with_specs(tmp_path)
    kinds = {"nan_grad", "kill", "hang"}
    exercised = {i.name for i in catalogue() if kinds & set(i.faults)}
    cov = coverage(result, tmp_path)
    assert cov.exercised == len(exercised) and cov.items == len(catalogue())
    assert (cov.emitted, cov.runs_read) == (len(EMITTED_BY_MAKE_SUITE), 2)  # runs/missing: none
    assert cov.exercised_emitted == len(EMITTED_BY_MAKE_SUITE & exercised)
    assert 0 < len(EMITTED_BY_MAKE_SUITE & exercised) < len(EMITTED_BY_MAKE_SUITE)
    assert coverage(result).emitted is None  # no root given: runs not read


def test_results_without_saved_specs_are_said_to_be_uncounted(tmp_path: Path) -> None:
    cov = coverage(make_suite(tmp_path))
    assert cov.rows == [] and cov.exercised == 0
    assert cov.notes == [
        "3 scenario(s) without a readable saved spec: their faults and mechanisms are not counted"
    ]


def test_the_scorecards_show_the_table_and_the_counts(tmp_path: Path) -> None:
    result = suite_with_specs(tmp_path)
    cov = coverage(result, tmp_path)
    page = render_html(result, tmp_path)
    section = page[
        page.index('id="coverage"') : page.index("</section>", page.index('id="coverage"'))
    ]
    nan_row = re.search(r"<tr><td><code>nan_grad</code></td>(.*?)</tr>", section)
    assert nan_row is not None
    cells = re.findall(r"<td class='num'>([^<]*)</td>", nan_row.group(1))
    assert len(cells) == 1 + len(COLUMNS) + 1  # scenarios, one per mechanism, unknown
    at = {name: cells[1 + i] for i, name in enumerate(COLUMNS)}
    assert (cells[0], at["nonfinite_guard"], at["surgery"], cells[-1]) == ("2", "1", "·", "1")
    counts = f"{cov.exercised} of {len(catalogue())} items exercised"
    assert counts in section and f"{cov.emitted} emitted by its 2 run(s) read" in section
    text = render_markdown(result, tmp_path)
    assert "### Coverage" in text and counts in text
    line = next(x for x in text.splitlines() if x.startswith("| nan_grad |"))
    # Every mechanism but surgery (disabled) and the opt-ins it did not enable (all but
    # forecast_acting, which is on wherever its detector is).
    off = ["surgery", *(name for name in OPT_IN if name != "forecast_acting")]
    never = ", ".join(off)
    assert line == f"| nan_grad | 2 | {len(COLUMNS) - len(off)} of {len(COLUMNS)} | {never} | 1 |"
    hang = next(x for x in text.splitlines() if x.startswith("| hang |"))
    assert hang == f"| hang | 1 | 0 of {len(COLUMNS)} | - | 1 |"
