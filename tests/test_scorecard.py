"""Scorecards: what each of the five files tells a user, reloading them, and comparing two."""

from __future__ import annotations

import dataclasses
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.oracles.verdict import Check
from harness.running.results import SCORECARD_VERSION, ScorecardError, SuiteResult
from harness.scorecard import compare, dumps_scorecard, load_scorecard
from harness.scorecard.render import (
    render_badge,
    render_comparison,
    render_html,
    render_junit,
    render_markdown,
    write_scorecards,
)
from harness.scorecard.render.badge import GREEN, RED, YELLOW
from tests.scorecard_support import FAILED_FIGURE, LOG_TAIL, make_suite


@pytest.fixture(scope="module")
def card(tmp_path_factory: pytest.TempPathFactory) -> tuple[SuiteResult, dict[str, Path]]:
    """The three-scenario suite, written once (the HTML's plots take a second or two)."""
    out = tmp_path_factory.mktemp("card")
    result = make_suite(out)
    return result, write_scorecards(result, out)


def test_all_five_files_are_written(card: tuple[SuiteResult, dict[str, Path]]) -> None:
    _, paths = card
    assert sorted(p.name for p in paths.values()) == sorted(
        ["scorecard.json", "scorecard.md", "junit.xml", "scorecard.html", "badge.svg"]
    )
    assert all(p.stat().st_size > 0 for p in paths.values())


def test_json_round_trip_keeps_score_and_statuses(
    card: tuple[SuiteResult, dict[str, Path]],
) -> None:
    result, paths = card
    for where in (paths["json"].parent, paths["json"]):
        back = load_scorecard(where)
        assert back.score == pytest.approx(result.score) == 50.0
        assert [r.status for r in back.scenarios] == ["passed", "failed", "error"]
        assert back.scenarios[1].checks == result.scenarios[1].checks
        assert back.scenarios[2].log_tail == LOG_TAIL
        assert back.class_scores() == result.class_scores()


def test_nan_figure_stays_valid_json_and_comes_back(tmp_path: Path) -> None:
    result = make_suite(tmp_path)
    nan_check = Check("loss_finite", False, math.nan, "", "finite", "Loss went NaN.")
    result.scenarios[0].checks.append(nan_check)
    result.scenarios[0].seconds = math.inf
    text = dumps_scorecard(result)
    (tmp_path / "scorecard.json").write_text(text)

    def refuse(token: str) -> None:
        raise AssertionError(f"scorecard.json holds the bare constant {token}")

    json.loads(text, parse_constant=refuse)
    back = load_scorecard(tmp_path).scenarios[0]
    assert math.isnan(back.checks[-1].figure)  # type: ignore[arg-type]
    assert back.seconds == math.inf and back.status == "failed"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{ this is not json", "not valid JSON"),
        ("[1, 2, 3]", "not a tightrope scorecard"),
        ('{"kind": "run_start"}', "not a tightrope scorecard"),
        (json.dumps({"scorecard_version": SCORECARD_VERSION + 1}), "scorecard_version"),
        (json.dumps({"scorecard_version": 1, "suite": "x"}), "malformed"),
    ],
)
def test_a_file_that_is_no_scorecard_is_refused_by_name(
    tmp_path: Path, content: str, says: str
) -> None:
    path = tmp_path / "scorecard.json"
    path.write_text(content)
    for where in (path, tmp_path):
        with pytest.raises(ScorecardError, match=says) as info:
            load_scorecard(where)
        assert str(path) in str(info.value)


def test_a_missing_scorecard_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ScorecardError, match=r"holds no scorecard\.json") as info:
        load_scorecard(tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(ScorecardError, match="does not exist"):
        load_scorecard(tmp_path / "nope.json")


def test_junit_has_a_testcase_per_scenario_with_figures(
    card: tuple[SuiteResult, dict[str, Path]],
) -> None:
    _, paths = card
    root = ET.parse(paths["junit"]).getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    assert (suite.get("name"), suite.get("tests"), suite.get("failures"), suite.get("errors")) == (
        "smoke",
        "3",
        "1",
        "1",
    )
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["nan-grad", "crash-resume", "corrupt-checkpoint"]
    assert cases["crash-resume"].get("classname") == "tightrope.smoke.process"

    props = {p.get("name"): p.get("value") for p in cases["crash-resume"].iter("property")}
    assert props["recovery_latency"] == str(FAILED_FIGURE)
    assert props["recovery_latency.seconds"] == "4.5"
    assert props["loss_gap"] == "0.012"
    assert props["score"] == "0.5" and props["resilience_score"] == "50.0"

    failure = cases["crash-resume"].find("failure")
    assert failure is not None
    assert "recovery_latency: 12 steps, expected <= 5 steps" in failure.get("message", "")
    assert cases["nan-grad"].find("failure") is None
    error = cases["corrupt-checkpoint"].find("error")
    assert error is not None and "before step 8" in error.get("message", "")
    assert "checkpoint shard 3 is corrupt" in (error.text or "")
    suite_props = {p.get("name"): p.get("value") for p in suite.find("properties") or []}
    assert suite_props["resilience_score"] == "50.0"


def test_junit_survives_control_characters_in_a_log(tmp_path: Path) -> None:
    result = make_suite(tmp_path)
    result.scenarios[2].log_tail = "\x1b[31mred\x1b[0m and a bell \x07 and a NUL \x00"
    error = ET.fromstring(render_junit(result)).find("testsuite/testcase/error")
    assert error is not None and "red and a bell  and a NUL " in (error.text or "")


def test_markdown_shows_score_failing_figure_and_log_tail(
    card: tuple[SuiteResult, dict[str, Path]],
) -> None:
    _, paths = card
    md = paths["markdown"].read_text()
    assert "**50.0 / 100**" in md
    assert "1 passed" in md and "1 failed" in md and "1 error" in md
    assert "| recovery_latency | 12 steps | <= 5 steps |" in md
    assert "| process | 50.0 |" in md
    assert "checkpoint shard 3 is corrupt" in md and "<details" in md
    # The passed scenario gets a table row, no failure section.
    assert "`nan-grad` failed" not in md


NO_FAULT = "no fault was injected (no fault_injected event), so there was nothing to recover from"


def unjudged_check() -> Check:
    """A check the evidence could not decide, as an oracle words one."""
    return Check("mttr", False, None, "s", "<= 10 s", NO_FAULT, judged=False)


def test_a_not_judged_check_fails_its_scenario_and_lowers_the_score(tmp_path: Path) -> None:
    result = make_suite(tmp_path)
    result.scenarios[0].checks.append(unjudged_check())
    nan_grad = result.scenarios[0]
    assert nan_grad.status == "failed" and nan_grad.score == pytest.approx(2 / 3)
    assert nan_grad.failed_checks == nan_grad.unjudged_checks == [unjudged_check()]
    # Was 50.0 with the scenario's two checks passed: (1 * 2/3 + 2 * 0.5 + 1 * 0) / 4.
    assert result.score == pytest.approx(100 * (2 / 3 + 1.0) / 4)

    md = render_markdown(result)
    assert "`nan-grad` failed" in md
    assert f"| mttr | not judged | <= 10 s | {NO_FAULT} |" in md
    assert "2 of 3 checks passed; 1 not judged, counted as failed." in md
    assert "1 check not judged (no evidence; scored as failed)" in md

    case = ET.fromstring(render_junit(result)).find("testsuite/testcase[@name='nan-grad']")
    assert case is not None
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "CheckNotJudged"
    assert failure.get("message", "").startswith(f"not judged: mttr, expected <= 10 s ({NO_FAULT})")
    assert "not judged: mttr" in (failure.text or "")

    page = render_html(result, tmp_path)
    assert "<tr class='check-not-judged'>" in page and "1 check not judged" in page


def test_junit_lists_a_not_judged_check_after_the_failed_ones(tmp_path: Path) -> None:
    result = make_suite(tmp_path)
    result.scenarios[1].checks.append(unjudged_check())
    case = ET.fromstring(render_junit(result)).find("testsuite/testcase[@name='crash-resume']")
    assert case is not None
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "CheckFailed"
    message = failure.get("message", "")
    assert message.startswith("1 of 3 checks failed: recovery_latency: 12 steps")
    assert "; not judged: mttr, expected <= 10 s" in message


def test_terminal_and_pytest_reports_label_a_not_judged_check(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from harness.commands.pytest_plugin import describe_failure
    from harness.scorecard.render.terminal import print_results

    result = make_suite(tmp_path)
    result.scenarios[0].checks.append(unjudged_check())
    text = describe_failure(result.scenarios[0])
    assert f"FAILED not judged: mttr, expected <= 10 s ({NO_FAULT})" in text
    assert "passed: detect_latency, params_finite" in text
    out = io.StringIO()
    print_results(result, Console(file=out, width=300, color_system=None))
    assert "2/3 (1 not judged)" in out.getvalue()
    assert "not judged: mttr, expected <= 10 s" in out.getvalue()


def test_json_keeps_not_judged_and_reads_older_checks_as_judged(tmp_path: Path) -> None:
    result = make_suite(tmp_path)
    result.scenarios[0].checks.append(unjudged_check())
    (tmp_path / "scorecard.json").write_text(dumps_scorecard(result))
    back = load_scorecard(tmp_path)
    assert back.scenarios[0].checks[-1] == unjudged_check()
    assert back.scenarios[0].checks[-1].status == "not judged"
    assert back.score == pytest.approx(result.score)
    old = unjudged_check().to_dict()
    del old["judged"]
    old["passed"] = True
    assert Check.from_dict(old).status == "passed"
    with pytest.raises(ValueError, match="passed without being judged"):
        Check("mttr", True, None, "s", "", "", judged=False)


def test_compare_shows_a_check_that_is_now_not_judged(
    card: tuple[SuiteResult, dict[str, Path]],
) -> None:
    old, _ = card
    first = old.scenarios[0]
    unjudged = dataclasses.replace(first.checks[0], passed=False, figure=None, judged=False)
    new_first = dataclasses.replace(first, checks=[unjudged, first.checks[1]])
    new = dataclasses.replace(old, scenarios=[new_first, *old.scenarios[1:]])
    c = compare(old, new)
    assert c.regressed and [b.check for b in c.broken_checks] == ["detect_latency"]
    assert "0 steps | not judged | <= 1 steps |" in render_comparison(c)


@pytest.mark.parametrize(
    ("score", "shown", "colour"),
    [
        (100.0, "100", GREEN),
        (90.0, "90", GREEN),
        (99.7, "99", GREEN),  # never rounded up to a perfect score
        (72.4, "72", YELLOW),
        (69.4, "69", RED),
        (0.0, "0", RED),
    ],
)
def test_badge_number_and_colour_follow_the_score(score: float, shown: str, colour: str) -> None:
    svg = render_badge(score)
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert texts.count("resilience") == 2 and texts.count(shown) == 2
    assert f'fill="{colour}"' in svg


def test_badge_file_matches_the_suite(card: tuple[SuiteResult, dict[str, Path]]) -> None:
    _, paths = card
    svg = paths["badge"].read_text()
    assert ">50</text>" in svg and f'fill="{RED}"' in svg


def test_html_is_self_contained_and_escaped(card: tuple[SuiteResult, dict[str, Path]]) -> None:
    _, paths = card
    page = paths["html"].read_text()
    for outside in ("<script", "<link", "src=", "url(http", "@import"):
        assert outside not in page
    assert "&lt;from&gt;" in page and "<from>" not in page
    for plot in ("plot-nan-grad-loss", "plot-nan-grad-loss-scale", "plot-nan-grad-grad-norm"):
        assert f'id="{plot}"' in page
    # crash-resume journaled no loss scale, so it gets no loss-scale plot.
    assert 'id="plot-crash-resume-loss"' in page and "plot-crash-resume-loss-scale" not in page
    assert "journal unreadable" in page and "runs/missing" in page


def test_html_notes_a_broken_journal_instead_of_crashing(tmp_path: Path) -> None:
    result = make_suite(tmp_path)
    with open(tmp_path / "runs" / "nan-grad" / "journal" / "rank-0.jsonl", "a") as f:
        f.write('{"v": 1, "kind": "st')
    (tmp_path / "runs" / "crash-resume" / "journal" / "rank-0.jsonl").write_text("")
    page = render_html(result, tmp_path)
    assert "skipped 1 torn line(s)" in page and 'id="plot-nan-grad-loss"' in page
    assert "runs/crash-resume holds no step events" in page


def test_compare_flags_a_check_that_now_fails_with_both_figures(
    card: tuple[SuiteResult, dict[str, Path]],
) -> None:
    old, _ = card
    first = old.scenarios[0]
    broken = Check("detect_latency", False, 3, "steps", "<= 1 steps", "Detected 3 steps late.")
    new_first = dataclasses.replace(first, checks=[broken, first.checks[1]])
    new = dataclasses.replace(old, scenarios=[new_first, *old.scenarios[1:]])
    c = compare(old, new)
    assert c.regressed
    assert [r.name for r in c.regressions] == ["nan-grad"]
    assert c.regressions[0].old_status == "passed" and c.regressions[0].new_status == "failed"
    [change] = c.broken_checks
    assert (change.check, change.old_figure, change.new_figure) == ("detect_latency", 0, 3)
    assert c.class_scores["numeric"] == (100.0, 50.0)
    text = render_comparison(c)
    assert "0 steps" in text and "3 steps" in text and "REGRESSED" in text
    assert not compare(new, old).regressed and compare(new, old).fixed_checks


def test_compare_of_identical_scorecards_flags_nothing(
    card: tuple[SuiteResult, dict[str, Path]],
) -> None:
    result, paths = card
    c = compare(result, load_scorecard(paths["json"]))
    assert not c.regressed and not c.improvements and not c.broken_checks
    assert c.delta == 0 and not c.added and not c.removed
    assert "no regressions" in render_comparison(c)


def test_compare_across_suites_matches_by_name_and_says_so(
    card: tuple[SuiteResult, dict[str, Path]],
) -> None:
    old, _ = card
    new = dataclasses.replace(old, suite="nightly", scenarios=old.scenarios[:2])
    c = compare(old, new)
    assert c.removed == ["corrupt-checkpoint"] and not c.regressed
    assert "different suites" in render_comparison(c)


def test_a_long_run_is_thinned_for_the_page_but_keeps_its_spike() -> None:
    from harness.scorecard.render.plots import MAX_POINTS, _thin

    steps = list(range(1, 20_001))
    loss = [2.0 + 0.001 * (s % 7) for s in steps]
    loss[12_345] = 40.0
    kept_steps, kept_loss = _thin(steps, loss)
    assert len(kept_steps) <= MAX_POINTS and 40.0 in kept_loss
    assert kept_steps == sorted(kept_steps) and (kept_steps[0], kept_steps[-1]) == (1, 20_000)
