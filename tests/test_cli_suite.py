"""`tightrope run/list/report/compare/schema`: exit codes, bad input refused before anything
runs, scorecards written, judged again from saved journals, and compared."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from harness.commands.main import main as tightrope

ROOT = Path(__file__).resolve().parent.parent
PLAIN = f"{sys.executable} {ROOT / 'tests' / 'plain_train.py'} --steps {{steps}}"


def suite(tmp_path: Path, poisoned: bool) -> Path:
    faults = "[{kind: nan_grad, at_step: 2}]" if poisoned else "[]"
    path = tmp_path / ("poisoned.yaml" if poisoned else "clean.yaml")
    path.write_text(
        f"""\
suite: plain
defaults:
  trainer: {{command: "{PLAIN}", steps: 10, checkpoint_every: 10, timeout: 120}}
scenarios:
  - name: run
    faults: {faults}
    expect: {{completed: true, params_finite: true}}
"""
    )
    return path


def code(argv: list[str]) -> int:
    try:
        return tightrope(argv)
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--trainer", "nosuchprogram --steps {steps}"], "program 'nosuchprogram' not found"),
        (["-k", "nothing-like-this"], "-k 'nothing-like-this' matches no scenario"),
        (["--trainer", "python t.py {stepz}"], "bad placeholder 'stepz'"),
    ],
)
def test_bad_run_input_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    out = tmp_path / "out"
    argv = ["run", str(suite(tmp_path, False)), "--scorecard", str(out), *extra]
    assert code(argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_an_invalid_suite_exits_2_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scenarios:\n  - name: a\n    expect: {max_lost_steps: -3}\n")
    assert code(["run", str(bad), "--scorecard", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: scenarios[0].expect.max_lost_steps: Input should be greater" in err
    assert code(["list", str(bad)]) == 2
    assert code(["run", str(tmp_path / "missing.yaml")]) == 2
    assert code(["run", str(bad), "--min-score", "120"]) == 2
    assert code(["run", str(bad), "--preset", "sturdy"]) == 2
    assert not (tmp_path / "out").exists()


def test_schema_and_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert code(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "tightrope suite"
    assert code(["list", str(ROOT / "scenarios" / "core.yaml"), "-k", "checkpoint"]) == 0
    out = capsys.readouterr().out
    assert "truncated-checkpoint" in out and "nan-grad-rank0" not in out


@pytest.mark.slow
def test_run_report_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean, poisoned = tmp_path / "clean", tmp_path / "poisoned"
    assert code(["run", str(suite(tmp_path, False)), "--scorecard", str(clean)]) == 0
    assert code(["run", str(suite(tmp_path, True)), "--scorecard", str(poisoned)]) == 1
    out = capsys.readouterr().out
    assert "params_finite: 3, expected true" in out and "resilience score 50.0" in out
    for name in ("scorecard.json", "scorecard.md", "junit.xml", "scorecard.html", "badge.svg"):
        assert (poisoned / name).is_file()

    # report judges the saved journals again: same verdicts after the files are rewritten
    (poisoned / "scorecard.md").unlink()
    assert code(["report", str(poisoned)]) == 1
    assert json.loads((poisoned / "scorecard.json").read_text())["score"] == 50.0
    assert (poisoned / "scorecard.md").is_file()
    # ...and from the journals, not the saved verdicts: a clean run whose journal gains a
    # non-finite parameter observation fails when judged again.
    copy = tmp_path / "tampered"
    shutil.copytree(clean, copy)
    journal = copy / "runs" / "run" / "journal" / "rank-0.jsonl"
    last_step = [json.loads(x) for x in journal.read_text().splitlines() if '"kind":"step"' in x][
        -1
    ]
    with journal.open("a") as f:
        f.write(json.dumps(last_step | {"params_finite": False}) + "\n")
    capsys.readouterr()
    assert code(["report", str(copy)]) == 1
    checks = json.loads((copy / "scorecard.json").read_text())["scenarios"][0]["checks"]
    assert {c["name"]: c["passed"] for c in checks} == {"params_finite": False, "completed": True}

    assert code(["compare", str(clean), str(poisoned)]) == 1
    out = capsys.readouterr().out
    assert "resilience score 100.0 -> 50.0" in out and "REGRESSED" in out
    assert code(["compare", str(clean), str(clean)]) == 0
    assert code(["compare", str(clean), str(tmp_path / "nowhere")]) == 2


def test_an_unreachable_docker_engine_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = tmp_path / "docker.yaml"
    suite.write_text(
        "scenarios:\n  - name: a\n"
        "    trainer: {launcher: docker, nodes: 2, world_size: 2, min_nodes: 1}\n"
        "    faults: [{kind: node_kill, at_step: 3, node: 1}]\n"
        "    expect: {completed: true}\n"
    )
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert code(["run", str(suite), "--scorecard", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Docker engine at unix:///nonexistent/docker.sock" in err
    assert not (tmp_path / "out" / "runs").exists()


@pytest.mark.timed
@pytest.mark.slow
def test_sigterm_ends_a_run_within_seconds_with_a_partial_scorecard(tmp_path: Path) -> None:
    import signal
    import subprocess
    import time

    hang = f"{sys.executable} -c 'import time; time.sleep(120)'"
    scenarios = "".join(
        f'  - {{name: s{i}, trainer: {{command: "{hang}", steps: 5, checkpoint_every: 5}},'
        " expect: {params_finite: true}}\n"
        for i in range(4)
    )
    path = tmp_path / "slow.yaml"
    path.write_text(f"suite: slow\nscenarios:\n{scenarios}")
    out = tmp_path / "card"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(path), "--scorecard", str(out),
         "--cores", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    time.sleep(6)  # two scenarios are sleeping by now
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    assert time.monotonic() - stopped < 10, output
    assert proc.returncode == 130, output
    card = json.loads((out / "scorecard.json").read_text())
    assert card["interrupted"] is True and card["passed"] is False
    assert all(s["error"].startswith("interrupted") for s in card["scenarios"])
    assert "scorecard is partial" in (out / "scorecard.md").read_text()
