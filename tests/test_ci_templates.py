"""The CI templates of examples/ci: valid for their CI's published schema, agreeing with
their one shell script, and that script run as a job runs it: the job summary gets the
scorecard, junit.xml is written, the exit code follows the verdict and --min-score, and a
regression against the target branch's scorecard is flagged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CI = ROOT / "examples" / "ci"
SCRIPT = CI / "run-suite.sh"
BIN = Path(sys.executable).parent
TEMPLATES = [
    ("github-actions.yml", "vendor.github-workflows"),
    ("gitlab-ci.yml", "vendor.gitlab-ci"),
]


def check_jsonschema(schema: str, path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema with one of the schemas it ships (no network: they are vendored)."""
    return subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", schema, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(("name", "schema"), TEMPLATES)
def test_template_is_valid_for_its_ci(name: str, schema: str) -> None:
    result = check_jsonschema(schema, CI / name)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("name", "schema", "good", "bad"),
    [
        ("github-actions.yml", "vendor.github-workflows", "runs-on:", "run-on:"),
        ("gitlab-ci.yml", "vendor.gitlab-ci", "when: always", "when: sometimes"),
    ],
)
def test_the_schema_check_refuses_a_broken_template(
    tmp_path: Path, name: str, schema: str, good: str, bad: str
) -> None:
    """The negative control: one misspelt key or value and the same check fails."""
    broken = tmp_path / name
    broken.write_text((CI / name).read_text().replace(good, bad, 1))
    assert check_jsonschema(schema, broken).returncode == 1


def _load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((CI / name).read_text())
    assert isinstance(data, dict)
    return data


def test_templates_run_the_script_and_publish_what_it_writes() -> None:
    """Each template's shell is the install and the script; its reports are the files the
    script's settings put them in."""
    github = _load("github-actions.yml")["jobs"]["resilience"]
    out = github["env"]["TIGHTROPE_OUT"]
    runs = [s["run"] for s in github["steps"] if "run" in s]
    assert runs == [
        "make install",
        "examples/ci/run-suite.sh fetch-target",
        "examples/ci/run-suite.sh run",
    ]
    uses = {s["uses"].split("@")[0]: s for s in github["steps"] if "uses" in s}
    assert uses["mikepenz/action-junit-report"]["with"]["report_paths"] == f"{out}/junit.xml"
    upload = uses["actions/upload-artifact"]["with"]
    assert upload["name"] == github["env"]["TIGHTROPE_ARTIFACT"]
    uploaded = set(upload["path"].split())
    for file in ("scorecard.json", "scorecard.md", "scorecard.html", "badge.svg", "junit.xml"):
        assert f"{out}/{file}" in uploaded

    gitlab = _load("gitlab-ci.yml")["tightrope"]
    out = gitlab["variables"]["TIGHTROPE_OUT"]
    script = [line for line in gitlab["script"] if not line.startswith("export ")]
    assert script == [
        "make install",
        "examples/ci/run-suite.sh fetch-target",
        "examples/ci/run-suite.sh run",
    ]
    assert gitlab["artifacts"]["reports"]["junit"] == f"{out}/junit.xml"
    assert f"{out}/scorecard.json" in gitlab["artifacts"]["paths"]  # what fetch-target reads


def _environment(tmp_path: Path, settings: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "TIGHTROPE": str(BIN / "tightrope"),
        "TIGHTROPE_CACHE": str(tmp_path / "cache"),
        "GITHUB_ACTIONS": "true",
        "OMP_NUM_THREADS": "1",
        **settings,
    }


def _script(
    tmp_path: Path, *args: str, timeout: float = 300, **settings: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        cwd=tmp_path,
        env=_environment(tmp_path, settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _start(tmp_path: Path, *args: str, **settings: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(SCRIPT), *args],
        cwd=tmp_path,
        env=_environment(tmp_path, settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_an_invalid_threshold_fails_the_job_and_says_so(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    result = _script(
        tmp_path,
        "run",
        TIGHTROPE_SUITE=str(ROOT / "scenarios" / "smoke.yaml"),
        TIGHTROPE_OUT=str(tmp_path / "out"),
        TIGHTROPE_MIN_SCORE="101",
        GITHUB_STEP_SUMMARY=str(summary),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "expected a score from 0 to 100" in result.stderr
    assert "wrote no scorecard (exit 2)" in summary.read_text()
    assert "::error title=tightrope::" in result.stdout


FAKE_GH = """#!/usr/bin/env bash
echo "$*" >> "$GH_LOG"
case "$1 $2" in
  "run list") [[ -n $GH_RUN_ID ]] && echo "$GH_RUN_ID"; exit 0 ;;
  "run download") mkdir -p "$7" && cp "$GH_SCORECARD" "$7/scorecard.json" ;;
  *) exit 1 ;;
esac
"""


@pytest.mark.parametrize("run_id", ["4242", ""])
def test_fetch_target_takes_the_newest_scorecard_of_the_target_branch(
    tmp_path: Path, run_id: str
) -> None:
    """fetch-target's calls to GitHub's CLI (a stand-in that records them); with no run on
    the target branch it succeeds with nothing fetched, since a first run has no target."""
    fake = tmp_path / "bin" / "gh"
    fake.parent.mkdir()
    fake.write_text(FAKE_GH)
    fake.chmod(0o755)
    stored = tmp_path / "stored.json"
    stored.write_text('{"suite": "smoke"}')
    target, log = tmp_path / "target", tmp_path / "gh.log"
    result = _script(
        tmp_path,
        "fetch-target",
        PATH=f"{fake.parent}:{os.environ['PATH']}",
        GH_LOG=str(log),
        GH_RUN_ID=run_id,
        GH_SCORECARD=str(stored),
        GITHUB_WORKFLOW="tightrope",
        TIGHTROPE_TARGET=str(target),
        TIGHTROPE_TARGET_BRANCH="main",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == (
        "run list --workflow tightrope --branch main --status completed --limit 1 "
        "--json databaseId --jq .[0].databaseId // empty"
    )
    if run_id:
        assert calls[1:] == [f"run download {run_id} --name tightrope-scorecard --dir {target}"]
        assert (target / "scorecard.json").read_text() == stored.read_text()
    else:
        assert calls[1:] == []
        assert "nothing to compare with" in result.stdout
        assert not (target / "scorecard.json").exists()


FAKE_CURL = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$CURL_LOG"
while [[ $# -gt 0 ]]; do
  if [[ $1 == --output ]]; then cp "$CURL_SCORECARD" "$2"; fi
  shift
done
"""


def test_fetch_target_on_gitlab_asks_the_job_artifacts_api(tmp_path: Path) -> None:
    """fetch-target's request on GitLab (a stand-in for curl that records it): the
    scorecard.json of the template's job on the target branch, with the job's token."""
    fake = tmp_path / "bin" / "curl"
    fake.parent.mkdir()
    fake.write_text(FAKE_CURL)
    fake.chmod(0o755)
    stored = tmp_path / "stored.json"
    stored.write_text('{"suite": "smoke"}')
    target, log = tmp_path / "target", tmp_path / "curl.log"
    result = _script(
        tmp_path,
        "fetch-target",
        PATH=f"{fake.parent}:{os.environ['PATH']}",
        GITHUB_ACTIONS="",
        GITLAB_CI="true",
        CI_API_V4_URL="https://gitlab.example/api/v4",
        CI_PROJECT_ID="7",
        CI_JOB_NAME="tightrope",
        CI_JOB_TOKEN="secret-token",
        CURL_LOG=str(log),
        CURL_SCORECARD=str(stored),
        TIGHTROPE_OUT="out/scorecard",
        TIGHTROPE_TARGET=str(target),
        TIGHTROPE_TARGET_BRANCH="release/2",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    args = log.read_text().splitlines()
    assert args[args.index("--header") + 1] == "JOB-TOKEN: secret-token"
    assert args[-1] == (
        "https://gitlab.example/api/v4/projects/7/jobs/artifacts/release%2F2/raw/"
        "out/scorecard/scorecard.json?job=tightrope"
    )
    assert "--fail" in args  # a missing artifact is an error curl reports, not a file
    assert (target / "scorecard.json").read_text() == stored.read_text()


def _cut_smoke_suite(tmp_path: Path) -> Path:
    """scenarios/smoke.yaml cut to its nan-grad scenario, 20 steps, the NaN at step 8, and
    without the checks against a fault-free run (final loss, false alarms): the job's
    plumbing is under test, and a run to compare with would double the trainer runs."""
    suite = yaml.safe_load((ROOT / "scenarios" / "smoke.yaml").read_text())
    suite["defaults"]["trainer"]["steps"] = 20
    (scenario,) = [s for s in suite["scenarios"] if s["name"] == "nan-grad"]
    scenario["faults"][0]["at_step"] = 8
    for needs_a_clean_run in ("final_loss_within", "max_false_alarms"):
        del scenario["expect"][needs_a_clean_run]
    suite["scenarios"] = [scenario]
    path = tmp_path / "smoke-cut.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def _junit_failures(path: Path) -> dict[str, int]:
    cases = ET.parse(path).getroot().iter("testcase")
    return {c.get("name", ""): len(c.findall("failure")) + len(c.findall("error")) for c in cases}


@pytest.mark.slow
def test_the_script_runs_the_suite_as_a_ci_job_does(tmp_path: Path) -> None:
    """Two jobs at once on the cut smoke suite. The reference trainer with no target
    scorecard: passes, the summary is its scorecard, junit.xml written. The fragile preset
    against a stored target-branch scorecard in which nan-grad passed (tests/ci_target,
    from a real run of this suite when it still had the checks against a fault-free run):
    fails, the regression flagged in the summary and as an annotation."""
    suite = _cut_smoke_suite(tmp_path)
    reference, fragile = tmp_path / "reference", tmp_path / "fragile"
    target = ROOT / "tests" / "ci_target"
    assert json.loads((target / "scorecard.json").read_text())["passed"] is True
    reference.mkdir()
    fragile.mkdir()
    jobs = {
        name: _start(
            tmp_path / name,
            "run",
            "-k",
            "nan-grad",
            *extra,
            TIGHTROPE_SUITE=str(suite),
            TIGHTROPE_MIN_SCORE="90",
            TIGHTROPE_OUT=str(tmp_path / name / "out"),
            TIGHTROPE_TARGET=str(where),
            GITHUB_STEP_SUMMARY=str(tmp_path / name / "summary.md"),
        )
        for name, extra, where in [
            ("reference", [], tmp_path / "no-target"),
            ("fragile", ["--preset", "fragile"], target),
        ]
    }
    logs = {name: job.communicate(timeout=300)[0] for name, job in jobs.items()}
    codes = {name: job.returncode for name, job in jobs.items()}
    assert codes == {"reference": 0, "fragile": 1}, logs

    out = reference / "out"
    scorecard = (out / "scorecard.md").read_text()
    assert "Minimum score 90: met" in scorecard
    # Nothing to compare with: the summary is the scorecard alone.
    assert (reference / "summary.md").read_text() == scorecard
    assert _junit_failures(out / "junit.xml") == {"nan-grad": 0}
    assert "nothing compared" in logs["reference"]

    out = fragile / "out"
    written = (fragile / "summary.md").read_text()
    assert written.startswith((out / "scorecard.md").read_text())
    assert "Minimum score 90: **not met**" in written
    assert "## Against the target branch" in written
    assert "verdict: REGRESSED" in written
    assert "nan-grad" in (out / "compare.md").read_text().split("Regressed scenarios")[1]
    regressed = "::error title=tightrope::resilience regressed against the target branch"
    assert regressed in logs["fragile"]
    assert _junit_failures(out / "junit.xml")["nan-grad"] > 0
    assert json.loads((out / "scorecard.json").read_text())["scenarios"][0]["status"] != ("passed")
