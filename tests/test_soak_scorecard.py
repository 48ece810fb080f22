"""A soak's figures in every scorecard format, and kept through a JSON round trip."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from harness.oracles.verdict import Check
from harness.records.journal import Event, Journal
from harness.running.results import ScenarioResult, SuiteResult
from harness.scorecard import load_scorecard
from harness.scorecard.render import write_scorecards
from harness.scorecard.render.terminal import print_results
from harness.soak.measures import measure


def _soak_result() -> SuiteResult:
    events, wall = [], 100.0
    events.append(Event("run_start", 0, 0, 0, wall, wall, {"world_size": 1, "pid": 1, "host": "h"}))
    for step in range(1, 21):
        wall += 1.0
        if step == 8:
            fault = {"fault": "nan_grad", "details": {"plan_index": 0}}
            events.append(Event("fault_injected", 8, 0, 0, wall - 0.5, wall - 0.5, fault))
        fields = {"loss": 3.0, "tokens": 64} | ({"skipped": True} if step == 8 else {})
        events.append(Event("step", step, 0, 0, wall, wall, fields))
    metrics = {"kind": "soak", "seed": 4, "rate": 0.01, "steps": 20, "planned_faults": 1}
    metrics |= measure(Journal(events), wall_seconds=25.0).to_dict()
    metrics["baseline"] = {"ettr": 0.9, "goodput": 60.0, "wall_seconds": 21.0}
    check = Check(name="kept_params_finite", passed=True, figure=0, unit="", expected="true",
                  detail="parameters finite")  # fmt: skip
    result = ScenarioResult(name="soak", fault_class="numeric", weight=1.0, checks=[check],
                            metrics=metrics)  # fmt: skip
    return SuiteResult(suite="soak-seed-4", preset="reference", scenarios=[result])


def test_every_format_shows_the_soak_s_figures(tmp_path: Path) -> None:
    files = write_scorecards(_soak_result(), tmp_path)
    markdown = files["markdown"].read_text()
    assert "| ETTR | 76.0% (fault-free run: 90.0%) |" in markdown
    assert "| nan_grad | 1 | 1 | 0 | 0 | 0 |" in markdown
    page = files["html"].read_text()
    assert 'id="soak-soak-ettr"' in page and 'id="soak-soak-mttr"' in page
    out = io.StringIO()
    print_results(_soak_result(), Console(file=out, width=200))
    text = out.getvalue()
    assert "ETTR        76.0%" in text and "time to recover by fault kind" in text


def test_a_soak_s_figures_survive_the_json_round_trip(tmp_path: Path) -> None:
    written = _soak_result()
    write_scorecards(written, tmp_path)
    read = load_scorecard(tmp_path)
    assert read.scenarios[0].metrics == written.scenarios[0].metrics
