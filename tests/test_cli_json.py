"""``--json`` of list, faults, status and summary: one document on stdout, parsed back,
whose figures are those of the suite, the registry and the journal."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from faults import FAULT_CLASSES, kinds
from harness.commands.main import main as tightrope
from harness.records.journal import JournalWriter, read_journal
from harness.records.status import job_status
from harness.records.summary import summarize
from harness.suites.suite_loader import load_suite

ROOT = Path(__file__).resolve().parents[1]


def _strict(text: str) -> Any:
    """Parse JSON refusing NaN and Infinity, which JSON does not have."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the output: not JSON")

    return json.loads(text, parse_constant=refuse)


def document(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> Any:
    """What ``tightrope ARGV`` printed, parsed as one JSON document."""
    assert tightrope(argv) == code
    return _strict(capsys.readouterr().out)


def test_list_json_names_every_chosen_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    suite = load_suite(ROOT / "scenarios/core.yaml")
    doc = document(["list", str(ROOT / "scenarios/core.yaml"), "--json"], capsys)
    assert (doc["format"], doc["version"], doc["suite"]) == ("tightrope.list", 1, suite.name)
    assert [s["name"] for s in doc["scenarios"]] == [s.name for s in suite.scenarios]
    for got, s in zip(doc["scenarios"], suite.scenarios, strict=True):
        assert got["checks"] == s.expect.checks()
        assert [f["kind"] for f in got["faults"]] == [f.kind for f in s.faults]
        assert got["trainer"]["steps"] == s.trainer.steps
        assert got["class"] == s.scored_class
    chosen = document(
        ["list", str(ROOT / "scenarios/core.yaml"), "-k", "nan_grad", "--json"], capsys
    )
    names = [s["name"] for s in chosen["scenarios"]]
    assert names and len(names) < len(suite.scenarios)
    assert all("nan_grad" in [f["kind"] for f in s["faults"]] for s in chosen["scenarios"])


def test_faults_json_lists_every_kind_with_its_parameters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = document(["faults", "--json"], capsys)
    assert doc["format"] == "tightrope.faults"
    assert doc["classes"] == list(FAULT_CLASSES)
    registered = kinds()
    assert sorted(k["name"] for k in doc["kinds"]) == sorted(registered)
    for k in doc["kinds"]:
        spec = registered[k["name"]].spec
        assert k["class"] == spec.fault_class
        own = [p["name"] for p in k["parameters"]]
        assert set(own) == set(spec.model_fields) - set(doc["common_parameters"]) - {"kind"}
    overflow = next(k for k in doc["kinds"] if k["name"] == "activation_overflow")
    params = {p["name"]: p for p in overflow["parameters"]}
    assert params["target"]["required"] is True
    assert params["factor"] == {"name": "factor", "required": False, "default": 100000.0}


@pytest.fixture
def journaled(tmp_path: Path) -> Path:
    """A run that trained 6 steps, the last with a NaN loss, with one fault fired."""
    with JournalWriter(tmp_path, rank=0) as w:
        w.emit("run_start", 0, world_size=1, pid=1, host="h", target_steps=10)
        for step in range(1, 6):
            w.emit("step", step, loss=4.0 / step, tokens=256, step_time=0.01)
        w.emit("fault_injected", 6, fault="nan_grad", target="blocks.0.attn.w", details={})
        w.emit("step", 6, loss=math.nan, tokens=256, step_time=0.01, skipped=True)
    return tmp_path


def test_status_json_matches_the_journal(
    journaled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = document(["status", str(journaled), "--json"], capsys)
    state = job_status(read_journal(journaled))
    assert doc["format"] == "tightrope.status"
    assert (doc["running"], doc["step"]) == (state.running, state.step) == (True, 6)
    assert doc["loss"] == "nan"  # a NaN loss, written as the journal writes it
    assert doc["fired"] == [
        {"fault": "nan_grad", "step": 6, "rank": 0, "target": "blocks.0.attn.w"}
    ]
    assert doc["armed"] == doc["rejected"] == []


def test_summary_json_matches_the_text_summary(
    journaled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = document(["summary", str(journaled), "--json"], capsys)
    result = summarize(read_journal(journaled))
    assert doc["format"] == "tightrope.summary"
    assert doc["verdict"] == result.verdict()
    assert (doc["steps"], doc["end_step"], doc["target_steps"]) == (6, 6, 10)
    assert doc["status"] is None and doc["restarts"] == 0 and doc["attempts"] == 1
    assert doc["loss_by_step"][0] == [1, 4.0]
    assert doc["loss_by_step"][-1] == [6, "nan"]
    assert doc["tokens"] == 6 * 256
    assert doc["median_step_time"] == pytest.approx(0.01)
    assert doc["warnings"] == []
    assert tightrope(["summary", str(journaled)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == f"verdict: {doc['verdict']}"


def test_json_of_a_missing_run_is_an_error_not_a_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tightrope(["summary", str(tmp_path / "nowhere"), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tightrope: error: ")
