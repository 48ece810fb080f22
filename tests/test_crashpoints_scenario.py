"""A crash-point exploration held by a suite (``crashpoints:`` in a scenario, #30): run by
pytest as one item that fails when a point's verdict is in ``fail_on``, its points the
checks of one scenario in the scorecard; and the block's bad input, named.

The job is ``tests/trainers/inplace_ckpt.py`` (a checkpoint and a ``latest`` marker written
in place), explored on an even sample of its points: ``max_points: 2`` gives the kill before
its run dir exists (PASS) and the torn ``latest`` of the save after step 2 (HARD_FAIL: the
resume cannot read it), both shown without tightrope in `tests/test_crashpoints.py`;
``max_points: 1`` gives the first alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.commands.main import main as tightrope
from harness.suites.suite_loader import ScenarioError, parse_suite

from .conftest import ROOT

pytest_plugins = ["pytester"]

SCRIPT = ROOT / "tests" / "trainers" / "inplace_ckpt.py"
COMMAND = f"{{python}} {SCRIPT} --out {{run_dir}} --steps 4 --every 2"


def suite(max_points: int) -> str:
    """A suite of one crashpoints scenario on the in-place job."""
    return (
        "suite: crash-form\n"
        "scenarios:\n"
        "  - name: inplace\n"
        f'    crashpoints: {{command: "{COMMAND}", max_points: {max_points}}}\n'
    )


@pytest.mark.slow
def test_a_suite_holds_an_exploration_and_fails_on_a_hard_fail(pytester: pytest.Pytester) -> None:
    """One exploration: run with a sample of 2 points (one HARD_FAIL) it fails; run again
    with a sample of 1 (its first point, PASS) it passes, from the first run's cache (the
    same scenario in the same scorecard folder: nothing trains again)."""
    pytester.makefile(".yaml", crash=suite(2))
    out = pytester.path / "card"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tightrope-scorecard={out}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*scenario inplace failed (score 50/100)*",
            "*FAILED #4 torn open latest: HARD_FAIL, expected not HARD_FAIL or SILENT_DIVERGENCE*"
            "reproduce: tightrope crashpoints * --only 4 -- *inplace_ckpt.py*",
            "*passed: #0 before mkdir .*",
        ]
    )
    card = json.loads((out / "scorecard.json").read_text())
    (scenario,) = card["scenarios"]
    assert scenario["status"] == "failed" and scenario["fault_class"] == "checkpoint"
    assert [(c["name"], c["figure"]) for c in scenario["checks"]] == [
        ("#0 before mkdir .", "PASS"),
        ("#4 torn open latest", "HARD_FAIL"),
    ]
    assert scenario["metrics"]["points_total"] == 9 and scenario["metrics"]["deterministic"]
    # The matrix sits in the scenario's run dir, as `tightrope crashpoints` writes it.
    matrix = json.loads((out / "runs" / "inplace" / "crashpoints.json").read_text())
    assert [(p["index"], p["verdict"]) for p in matrix["points"]] == [(0, "PASS"), (4, "HARD_FAIL")]
    junit = (out / "junit.xml").read_text()
    assert junit.count("<failure") == 1 and "HARD_FAIL" in junit

    pytester.makefile(".yaml", crash=suite(1))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tightrope-scorecard={out}")
    result.assert_outcomes(passed=1)
    matrix = json.loads((out / "runs" / "inplace" / "crashpoints.json").read_text())
    assert [(p["index"], p["verdict"], p["cached"]) for p in matrix["points"]] == [
        (0, "PASS", True)
    ]
    card = json.loads((out / "scorecard.json").read_text())
    assert card["scenarios"][0]["status"] == "passed" and card["score"] == 100.0


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            "{command: 'python t.py {run_dir}', bogus: 1}",
            "crashpoints.bogus: unknown crashpoints field 'bogus'; expected one of command, ",
        ),
        (
            "{command: 'python t.py {run_dir}', fail_on: [hard_fial]}",
            "crashpoints.fail_on: unknown verdict HARD_FIAL; choose from HARD_FAIL, "
            "SILENT_DIVERGENCE, LOST_WORK, PASS",
        ),
        (
            "{command: 'python t.py {run_dir}', max_points: -1}",
            "crashpoints.max_points: Input should be greater than or equal to 1 (got -1)",
        ),
        (
            "{command: 'python t.py {run_dir}', max_points: 0}",
            "crashpoints.max_points: Input should be greater than or equal to 1",
        ),
        (
            "{command: 'python t.py --out x'}",
            "crashpoints.command: crashpoints.command has no {run_dir}",
        ),
        (
            "{command: 'python t.py {run_dir}', resume_command: 'python t.py'}",
            "crashpoints.resume_command: crashpoints.resume_command has no {run_dir}",
        ),
        (
            "{command: 'python t.py {run_dir}', ranks: 0}",
            "crashpoints.ranks: Input should be greater than or equal to 1",
        ),
        ("{max_points: 2}", "crashpoints.command: Field required"),
    ],
)
def test_a_bad_crashpoints_block_is_named(block: str, expected: str) -> None:
    text = f"scenarios:\n  - name: cp\n    crashpoints: {block}\n"
    with pytest.raises(ScenarioError) as caught:
        parse_suite(yaml.safe_load(text), "s.yaml", None)
    assert f"s.yaml: scenarios[0].{expected}" in str(caught.value)


def test_a_crashpoints_scenario_takes_no_trainer_faults_or_checks() -> None:
    text = (
        "defaults: {expect: {completed: true}, trainer: {steps: 3}}\n"
        "scenarios:\n"
        "  - name: cp\n"
        "    crashpoints: {command: 'python t.py {run_dir}'}\n"
        "    expect: {completed: true}\n"
        "    faults: [{kind: nan_grad, at_step: 2}]\n"
        "  - name: alone\n"
        "    crashpoints: {command: 'python t.py {run_dir}'}\n"
    )
    with pytest.raises(ScenarioError) as caught:
        parse_suite(yaml.safe_load(text), "s.yaml", None)
    problems = caught.value.problems
    assert len(problems) == 2, problems
    assert all("not with crashpoints" in p for p in problems)
    assert {p.split(": ")[1] for p in problems} == {"scenarios[0].expect", "scenarios[0].faults"}
    # Without them it is valid, and the suite's default trainer and checks stay out of it.
    suite = parse_suite(
        yaml.safe_load(
            text.replace("    expect: {completed: true}\n", "").replace(
                "    faults: [{kind: nan_grad, at_step: 2}]\n", ""
            )
        ),
        "s.yaml",
    )
    alone = suite.scenarios[1]
    assert alone.crashpoints is not None and alone.expect.checks() == []
    assert alone.crashpoints.fail_on == ["HARD_FAIL", "SILENT_DIVERGENCE"]
    assert alone.scored_class == "checkpoint"


def test_tightrope_run_reports_a_job_that_cannot_run_as_the_scenarios_error(
    tmp_path: Path,
) -> None:
    """`tightrope run` runs the block too; a fault-free run that fails is the scenario's
    error (score 0), named, and the suite fails (no torch: the job exits at once)."""
    fails = "{python} -c 'import sys; sys.exit(3)' {run_dir}"
    path = tmp_path / "s.yaml"
    path.write_text(f'scenarios:\n  - name: broken\n    crashpoints: {{command: "{fails}"}}\n')
    out = tmp_path / "card"
    assert tightrope(["run", str(path), "--scorecard", str(out), "--cores", "1"]) == 1
    card = json.loads((out / "scorecard.json").read_text())
    assert card["preset"] == "command"  # the job's own command, not the reference trainer
    (scenario,) = card["scenarios"]
    assert scenario["status"] == "error" and scenario["checks"] == []
    assert "the fault-free run exited with 3" in scenario["error"]


@pytest.mark.parametrize(
    ("verdict", "deterministic", "status"),
    [
        ("HARD_FAIL", True, "failed"),
        ("LOST_WORK", True, "passed"),  # not in the default fail_on
        ("SILENT_DIVERGENCE", True, "failed"),
        ("SILENT_DIVERGENCE", False, "not judged"),  # the job differs from itself
        ("PASS", False, "passed"),
    ],
)
def test_a_point_becomes_a_check_failed_by_fail_on(
    verdict: str, deterministic: bool, status: str
) -> None:
    from harness.crashpoints.explore import PointResult
    from harness.crashpoints.plan import FileEvent, Point
    from harness.crashpoints.report import Matrix
    from harness.crashpoints.scenario import point_check
    from harness.crashpoints.verdict import Outcome

    event = FileEvent(n=3, op="open", path="latest", tornable=True, wall=0.0, save_step=2)
    outcome = Outcome(0, True, True, 1, False, None, 2, None, None, None, False)
    result = PointResult(Point(4, 0, "torn", event), verdict, "why", outcome, 1.0)
    matrix = Matrix(deterministic, 1.0, [result], 1, lambda i: f"tightrope crashpoints --only {i}")
    check = point_check(result, matrix, ["HARD_FAIL", "SILENT_DIVERGENCE"])
    assert check.name == "#4 torn open latest" and check.figure == verdict
    assert check.status == status
    assert ("--only 4" in check.detail) is (status == "failed")
