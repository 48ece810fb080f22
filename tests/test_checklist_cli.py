"""``tightrope checklist``: a run directory's emitted items, a suite's exercised and missed
items, as text and as one JSON document; bad input exits 2 with a message naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.checklist.catalogue import catalogue
from harness.commands.main import main as tightrope
from harness.suites.suite_loader import load_suite
from tests.checklist_support import EMITTED, write_run

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "scenarios" / "core.yaml"

ONE_SCENARIO = """\
suite: one
scenarios:
  - name: only-nan
    faults:
      - {kind: nan_grad, at_step: 5}
    expect: {completed: true}
"""


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = tightrope(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_dir_text_lists_emitted_items_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path)
    code, out, _ = run_cli(["checklist", str(tmp_path)], capsys)
    assert code == 0
    total = len(catalogue())
    summary = next(line for line in out.splitlines() if "items emitted" in line)
    assert summary.startswith(f"{len(EMITTED)}/{total} items emitted; not emitted: ")
    missing = summary.split("not emitted: ", 1)[1].split(", ")
    assert set(missing) == {i.name for i in catalogue()} - EMITTED
    assert "[x] nonfinite-step-guard" in out
    assert "[-] host-memory" in out  # evidence: none, said so


def test_run_dir_json_is_one_document_with_the_evidence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path, frozenset({"detected"}))
    code, out, _ = run_cli(["checklist", str(tmp_path), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert (doc["format"], doc["version"], doc["mode"]) == ("tightrope.checklist", 1, "run")
    by_name = {i["name"]: i for i in doc["items"]}
    assert {n for n, i in by_name.items() if i["emitted"]} == EMITTED - {"nonfinite-step-guard"}
    assert doc["emitted"] == len(EMITTED) - 1 and doc["total"] == len(catalogue())
    assert by_name["layer-grad-norm"]["found"][1] == {
        "evidence": "microscope.grad_norm",
        "count": 1,
        "detail": "1 records with a value",
    }


def test_core_suite_misses_only_what_none_of_its_fault_kinds_exercise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    suite = load_suite(CORE)
    injected = {f.kind for s in suite.scenarios for f in s.faults}
    code, out, _ = run_cli(["checklist", str(CORE), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["mode"] == "suite" and doc["suite"] == "core"
    missed = set(doc["missed"])
    assert missed == {i.name for i in catalogue() if not injected & set(i.faults)}
    # Every item without a fault kind is missed; the stalled layer is reached through
    # grad_underflow, by the scenarios that inject it.
    assert {i.name for i in catalogue() if not i.faults} <= missed
    stalled = next(i for i in doc["items"] if i["name"] == "stalled-layer")
    underflow = [
        s.name for s in suite.scenarios if any(f.kind == "grad_underflow" for f in s.faults)
    ]
    assert stalled["exercised"] and stalled["scenarios"] == underflow
    assert stalled["by_kinds"] == ["grad_underflow"]


def test_a_one_scenario_suite_lists_what_it_misses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "one.yaml"
    suite.write_text(ONE_SCENARIO)
    code, out, _ = run_cli(["checklist", str(suite)], capsys)
    assert code == 0
    assert "[x] nonfinite-step-guard" in out and "1 scenario, through nan_grad" in out
    assert "[ ] dedup-drops" in out and "missed: needs one of duplicate_contamination" in out
    summary = out.strip().splitlines()[-1]
    exercised = {i.name for i in catalogue() if "nan_grad" in i.faults}
    assert summary.startswith(f"{len(exercised)}/{len(catalogue())} items exercised")
    assert "dedup-drops" in summary.split("misses: ", 1)[1].split(", ")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "nowhere", "does not exist: expected a run directory or a suite file"),
        (lambda p: p, "is not a run directory"),
        (lambda p: _write(p / "notes.txt", "hi"), "is neither a directory nor a .yaml file"),
        (lambda p: _write(p / "bad.yaml", "suite: x\nscenarios: 3\n"), "bad.yaml"),
    ],
)
def test_bad_input_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, message: str
) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    code, out, err = run_cli(["checklist", str(target), "--json"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("tightrope: error: ") and message in err


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
