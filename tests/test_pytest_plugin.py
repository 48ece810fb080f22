"""The pytest plugin, run through pytester: suites collected as items, failures with figures,
the option group, the scorecard, the score threshold and the tightrope_run fixture."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
PLAIN = f"{sys.executable} {ROOT / 'tests' / 'plain_train.py'} --steps {{steps}}"

SUITE = f"""\
suite: plain
defaults:
  trainer: {{command: "{PLAIN}", steps: 4, checkpoint_every: 4, timeout: 120}}
scenarios:
  - name: clean
    expect: {{completed: true}}
  - name: poisoned
    faults: [{{kind: nan_grad, at_step: 2}}]
    expect: {{completed: true, params_finite: true}}
"""


SWEEP = f"""\
sweep: grid
scenario:
  trainer: {{command: "{PLAIN}", steps: 4, checkpoint_every: 4, timeout: 120}}
  expect: {{completed: true}}
grid: {{steps: [4]}}
"""


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder for the temporary files of the sessions the test starts (TMPDIR)."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


@pytest.fixture
def suite_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".yaml", plain=SUITE)
    pytester.makefile(".yaml", other="just: a config file\n")
    return pytester


def test_each_scenario_is_an_item_and_other_yaml_is_left_alone(
    suite_dir: pytest.Pytester, temp: Path
) -> None:
    suite_dir.makefile(".yaml", grid=SWEEP)
    result = suite_dir.runpytest_subprocess("--collect-only", "-q")
    result.stdout.fnmatch_lines(
        ["grid.yaml::*", "plain.yaml::clean", "plain.yaml::poisoned", "*3 tests collected*"]
    )
    assert "other.yaml" not in result.stdout.str()
    # Nothing ran: no scorecard folder was made (test_the_fixture_runs_a_scenario_written_in_
    # python is its negative control).
    assert list(temp.iterdir()) == []


@pytest.mark.slow
def test_a_failing_scenario_shows_its_checks_with_figures(suite_dir: pytest.Pytester) -> None:
    # With a score threshold above the session's score: the session says it fell short
    # (test_the_score_threshold_passes_a_session_that_meets_it is its negative control).
    out = suite_dir.path / "card"
    result = suite_dir.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--tightrope-scorecard={out}", "--tightrope-min-score=80"
    )
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "*scenario poisoned failed (score 50/100)*",
            # Two looks (at the injection, at the end) and the last step's unchecked NaN.
            "*FAILED params_finite: 3, expected true: 3 signs of non-finite weights (2 of 2 "
            "observations saw them, 1 last step that applied a non-finite loss)*",
            "*passed: completed*",
            "*tightrope: resilience score 75.0/100; scorecards in*",
            "*score 75.0 is below --tightrope-min-score 80*",
        ]
    )
    card = json.loads((out / "scorecard.json").read_text())
    assert card["suite"] == "plain" and card["score"] == 75.0
    assert [s["status"] for s in card["scenarios"]] == ["passed", "failed"]
    assert (out / "junit.xml").is_file() and (out / "scorecard.html").is_file()


@pytest.mark.slow
def test_the_score_threshold_passes_a_session_that_meets_it(suite_dir: pytest.Pytester) -> None:
    """Only the clean scenario, at the highest threshold: met, so the session passes (the
    threshold failing a session is shown with the failing scenario above)."""
    result = suite_dir.runpytest_subprocess("-k", "clean", "--tightrope-min-score=100")
    result.assert_outcomes(passed=1, deselected=1)
    assert result.ret == 0
    assert "below --tightrope-min-score" not in result.stdout.str()


def test_bad_options_are_usage_errors(suite_dir: pytest.Pytester) -> None:
    result = suite_dir.runpytest_subprocess("--tightrope-preset=sturdy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown preset 'sturdy'; expected one of reference, fragile*"])
    result = suite_dir.runpytest_subprocess("--tightrope-min-score=120")
    result.stderr.fnmatch_lines(["*120 is not within 0 to 100*"])


def test_an_invalid_suite_is_a_collection_error_naming_the_line(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", bad="scenarios:\n  - name: a\n    expect: {detectd: true}\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*bad.yaml:3: scenarios[[]0[]].expect.detectd: unknown check*"])


@pytest.mark.slow
def test_the_fixture_runs_a_scenario_written_in_python(
    pytester: pytest.Pytester, temp: Path
) -> None:
    """... and writes the session's scorecard in a folder of its own when none is given."""
    pytester.makepyfile(
        f"""
        def test_nan(tightrope_run):
            result = tightrope_run(
                {{
                    "name": "nan",
                    "faults": [{{"kind": "nan_grad", "at_step": 2}}],
                    "expect": {{"params_finite": True, "completed": True}},
                }},
                trainer={{"command": {PLAIN!r}, "steps": 4, "checkpoint_every": 4}},
            )
            assert result.status == "failed"
            assert [c.name for c in result.failed_checks] == ["params_finite"]
            assert result.failed_checks[0].figure == 3  # step 2, the last NaN loss, run_end
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
    (folder,) = temp.glob("tightrope-*")
    assert (folder / "scorecard.json").exists()
