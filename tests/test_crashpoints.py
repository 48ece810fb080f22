"""``tightrope crashpoints`` (#30): a job killed at every file event of its saves (and with
each file its writer wrote torn), resumed, and classified.

The negative control, ``tests/trainers/inplace_ckpt.py``, saves in place (``torch.save``
straight to ``ckpt.pt``, then a ``latest`` marker it trusts): its torn files must be
HARD_FAIL, established here without tightrope (the torn file is half the fault-free one,
and the job's own resume, run by the test, fails on it). The reference trainer must pass
its points. Each exploration is as short as it can be: 4 steps of a tiny loop, 2 steps of
the tiny preset, one core (``make test`` gives the module one of its two workers).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.commands.main import main as tightrope

from .conftest import ROOT

SCRIPT = str(ROOT / "tests" / "trainers" / "inplace_ckpt.py")
COMMAND = ["--", sys.executable, SCRIPT, "--out", "{run_dir}", "--steps", "4", "--every", "2"]


def explore(out: Path, *flags: str, command: list[str] = COMMAND) -> tuple[int, dict[str, Any]]:
    code = tightrope(["crashpoints", "--out", str(out), "--cores", "1", *flags, *command])
    return code, json.loads((out / "crashpoints.json").read_text())


@pytest.fixture(scope="module")
def negative(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, dict[str, Any]]:
    out = tmp_path_factory.mktemp("inplace")
    code, doc = explore(out)
    return out, code, doc


def points_at(doc: dict[str, Any], path: str, mode: str, step: int) -> list[dict[str, Any]]:
    found = [
        p
        for p in doc["points"]
        if p["event"]["path"] == path and p["mode"] == mode and p["event"]["save_step"] == step
    ]
    assert found, f"no {mode} point at {path} of the save after step {step}"
    return found


@pytest.mark.slow
def test_a_loop_saving_in_place_fails_hard_where_its_files_are_torn(
    negative: tuple[Path, int, dict[str, Any]],
) -> None:
    out, code, doc = negative
    assert code == 1  # HARD_FAIL is in the default --fail-on
    assert doc["deterministic"] is True
    # Its points ran forked from the warm interpreter, whose own fault-free run matched.
    assert doc["notes"] == [] and (out / "fault-free-forked" / "done.json").is_file()
    assert sum(doc["summary"].values()) == len(doc["points"]) == doc["points_total"]
    whole = (out / "fault-free-1" / "run" / "ckpt.pt").stat().st_size
    # The second save's checkpoint torn: `latest` still names the first, whose bytes are gone.
    (torn,) = points_at(doc, "ckpt.pt", "torn", 4)
    assert torn["verdict"] == "HARD_FAIL"
    run_dir = out / "points" / f"{torn['index']:04d}-r0-torn-{torn['event']['n']}" / "run"
    assert (run_dir / "ckpt.pt").stat().st_size == whole // 2
    assert torn["evidence"]["torn"] == {"whole_bytes": whole, "torn_bytes": whole // 2}
    again = subprocess.run(
        [sys.executable, SCRIPT, "--out", str(run_dir), "--steps", "4", "--every", "2"],
        capture_output=True,
        text=True,
    )
    assert again.returncode != 0 and "Error" in again.stderr  # the job's own resume, by hand
    # A torn `latest` (JSON cut in half) fails at every save.
    for step in (2, 4):
        (marker,) = points_at(doc, "latest", "torn", step)
        assert marker["verdict"] == "HARD_FAIL", marker
    # Killed between the checkpoint and its marker: the new weights under the old step.
    (between,) = points_at(doc, "latest", "before", 4)
    assert between["verdict"] == "SILENT_DIVERGENCE", between
    index = between["index"]
    run_dir = out / "points" / f"{index:04d}-r0-before-{between['event']['n']}" / "run"
    mine = torch.load(run_dir / "ckpt.pt", weights_only=True)["model"]
    clean = torch.load(out / "fault-free-1" / "run" / "ckpt.pt", weights_only=True)["model"]
    assert any(not torch.equal(mine[k], clean[k]) for k in clean)  # read back: they differ
    # Before anything of a save was written, the job resumes from the save before: a pass.
    for step in (2, 4):
        (before,) = points_at(doc, "ckpt.pt", "before", step)
        assert before["verdict"] == "PASS", before
    failing = [p for p in doc["points"] if p["verdict"] in ("HARD_FAIL", "SILENT_DIVERGENCE")]
    assert all("--only" in p["reproduce"] for p in failing)
    assert (out / "junit.xml").read_text().count("<failure") == len(failing)


@pytest.mark.slow
def test_a_second_run_of_the_same_exploration_reuses_every_point(
    negative: tuple[Path, int, dict[str, Any]],
) -> None:
    out, code, first = negative
    stamp = (out / "fault-free-1" / "done.json").stat().st_mtime_ns
    again, doc = explore(out)
    assert again == code
    assert all(p["cached"] for p in doc["points"])
    assert [p["verdict"] for p in doc["points"]] == [p["verdict"] for p in first["points"]]
    assert (out / "fault-free-1" / "done.json").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_only_reproduces_one_point_with_the_same_verdict(
    negative: tuple[Path, int, dict[str, Any]], tmp_path: Path
) -> None:
    out, _, doc = negative
    (torn,) = points_at(doc, "ckpt.pt", "torn", 4)
    for fault_free in out.glob("fault-free-*"):  # cached: only the point runs again, afresh
        shutil.copytree(fault_free, tmp_path / fault_free.name)
    code, one = explore(tmp_path, "--only", str(torn["index"]))
    assert code == 1
    assert [(p["index"], p["verdict"]) for p in one["points"]] == [(torn["index"], "HARD_FAIL")]
    assert one["points_total"] == doc["points_total"]
    assert not one["points"][0]["cached"]


@pytest.mark.slow
def test_only_out_of_range_is_refused(
    negative: tuple[Path, int, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    out, _, doc = negative
    total = doc["points_total"]
    code = tightrope(["crashpoints", "--out", str(out), "--only", str(total), *COMMAND])
    assert code == 2
    assert f"--only {total}: out of range" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--"], "no command after '--'"),
        (["--", "python", "train.py"], "the command has no {run_dir}"),
        (["--steps", "3", *COMMAND], "--steps: for the reference trainer only"),
        (["--resume-command", "python r.py {run_dir}"], "--resume-command needs the job's"),
        (["--resume-command", "python r.py", *COMMAND], "--resume-command has no {run_dir}"),
    ],
)
def test_bad_input_is_refused_with_what_was_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert tightrope(["crashpoints", "--out", str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["PASS,BOGUS", "", "lost"])
def test_an_unknown_fail_on_verdict_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        tightrope(["crashpoints", "--out", str(tmp_path), "--fail-on", value, *COMMAND])
    assert exc.value.code == 2
    assert "--fail-on: unknown verdict" in capsys.readouterr().err


@pytest.mark.slow
def test_the_reference_trainer_passes_the_crash_points(tmp_path: Path) -> None:
    """An even sample of its points (all of them take minutes: docs/crashpoints.md gives the
    full matrix), the first being a kill before the run dir exists. Four is the smallest
    even sample of its points (37 today) that meets the start-up, the full save and the delta save,
    killed before an event and with a file torn (three are all kills before an event)."""
    flags = ("--steps", "2", "--checkpoint-every", "1", "--max-points", "4")
    code, doc = explore(tmp_path, *flags, command=[])
    assert code == 0, [p for p in doc["points"] if p["verdict"] != "PASS"]
    assert doc["deterministic"] is True
    assert doc["points_total"] > 20
    assert doc["summary"]["PASS"] == len(doc["points"]) == 4
    saves = {p["event"]["save_step"] for p in doc["points"]}
    assert saves == {None, 1, 2}  # the start-up, the full save and the delta save
    assert {p["mode"] for p in doc["points"]} == {"before", "torn"}
    assert doc["points"][0]["event"] == {
        "n": 1,
        "op": "mkdir",
        "path": ".",
        "occurrence": 1,
        "save_step": None,
        "tornable": False,
    }


@pytest.mark.slow
def test_a_point_is_met_by_its_event_not_by_its_number(tmp_path: Path) -> None:
    """The first run writes one file more than the later ones, so every point's event comes
    one number earlier in its run than in the fault-free run: the kill must still land on
    it (its op, path and occurrence), as the files the crash left on disk show (the resume
    does nothing here, so the run dir stays as the kill left it)."""
    script = str(ROOT / "tests" / "trainers" / "shifting_events.py")
    counter = str(tmp_path / "runs")
    command = ["--", sys.executable, script, "--out", "{run_dir}", "--counter", counter]
    resume = f"{sys.executable} -c pass {{run_dir}}"
    explore(tmp_path / "cp", "--resume-command", resume, command=command)
    doc = json.loads((tmp_path / "cp" / "crashpoints.json").read_text())
    replaced = [p for p in doc["points"] if p["event"]["op"] == "replace" and p["mode"] == "before"]
    assert [p["event"]["occurrence"] for p in replaced] == [1, 2]
    for point in replaced:
        k = point["event"]["occurrence"]
        assert point["evidence"]["killed"] and point["evidence"]["event_matched"], point
        run_dir = (
            tmp_path
            / "cp"
            / "points"
            / f"{point['index']:04d}-r0-before-{point['event']['n']}"
            / "run"
        )
        assert (run_dir / "ckpt.tmp").read_text() == f"step {k}\n"  # written, not yet installed
        assert not (run_dir / "scratch.txt").exists()  # a later run: one event fewer
        if k == 1:
            assert not (run_dir / "ckpt").exists()
        else:
            assert (run_dir / "ckpt").read_text() == f"step {k - 1}\n"
    others = [p for p in doc["points"] if p["event"]["path"] != "scratch.txt"]
    assert all(p["evidence"]["killed"] and p["evidence"]["event_matched"] for p in others)


@pytest.mark.slow
def test_a_job_that_differs_when_forked_runs_every_point_fresh(tmp_path: Path) -> None:
    """The forked fault-free run writes a file the fresh ones did not (the job saw the warm
    interpreter's imports), so the exploration must not trust the fork: a note says so, and
    the point's runs (the killed one and its resume) were fresh (their own output says)."""
    script = str(ROOT / "tests" / "trainers" / "forked_differs.py")
    command = ["--", sys.executable, script, "--out", "{run_dir}"]
    out = tmp_path / "cp"
    _, doc = explore(out, "--max-points", "1", command=command)
    forked_log = (out / "fault-free-forked" / "output.log").read_text()
    assert "forked=True" in forked_log  # the fork was tried, and the job told it apart
    assert "forked=False" in (out / "fault-free-1" / "output.log").read_text()
    assert any("did not leave what a fresh one left" in n for n in doc["notes"]), doc["notes"]
    (point,) = doc["points"]
    folder = out / "points" / f"{point['index']:04d}-r0-{point['mode']}-{point['event']['n']}"
    for log in ("crash.log", "resume.log"):
        text = (folder / log).read_text()
        assert "forked=False" in text and "forked=True" not in text, (log, text)
    assert not (folder / "run" / "forked.txt").exists()
