"""Detector names have one home (`harness.records.detectors`): a scenario file or a
checklist item that names a detector no one has is refused where it is written, and the
names the reference trainer claims are all in the table."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.checklist.catalogue import catalogue, parse_evidence
from harness.records.detectors import CLAIMED, DETECTORS
from harness.suites.suite_loader import ScenarioError, load_suite

ROOT = Path(__file__).resolve().parents[1]

SUITE = """\
suite: demo
scenarios:
  - name: nan
    faults:
      - {{kind: nan_grad, at_step: 5}}
    expect:
      detected: {{within_steps: 0, detector: {detector}}}
"""


def _load(tmp_path: Path, detector: str) -> object:
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.format(detector=detector))
    return load_suite(path)


def test_a_scenario_naming_an_unknown_detector_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as caught:
        _load(tmp_path, "[nonfinite_guard, nonfinite_gaurd]")
    (problem, *_) = caught.value.problems
    assert problem.startswith(f"{tmp_path / 'suite.yaml'}:3: scenarios[0]")
    assert "expect.detected.detector: unknown detector" in problem
    assert "unknown detector 'nonfinite_gaurd'" in problem
    assert "known detectors: " in problem and "nonfinite_guard" in problem
    assert "'nonfinite_guard'," not in problem.split("(got")[0]  # only the bad one is named


@pytest.mark.parametrize("detector", ["nonfinite_guard", "[rank_lost, restart]", "rollback"])
def test_a_scenario_naming_known_detectors_loads(tmp_path: Path, detector: str) -> None:
    assert _load(tmp_path, detector) is not None


def test_a_command_trainer_may_name_a_detector_of_its_own(tmp_path: Path) -> None:
    """A trainer of the user's claims what it likes (`harness.claim("my_guard")`): its
    scenarios are not held to the reference trainer's names."""
    path = tmp_path / "suite.yaml"
    text = SUITE.format(detector="my_guard").replace(
        "  - name: nan\n", "  - name: nan\n    trainer: {command: python train.py}\n"
    )
    path.write_text(text)
    (scenario,) = load_suite(path).scenarios
    assert scenario.expect.detected is not None
    assert scenario.expect.detected.detector == "my_guard"


def test_every_shipped_suite_names_known_detectors() -> None:
    files = [*sorted((ROOT / "scenarios").glob("*.yaml")), ROOT / "tests/trainers/verdicts.yaml"]
    for path in files:
        load_suite(path)  # raises on an unknown detector


def test_the_checklist_names_known_detectors() -> None:
    named = [
        e.match[1]
        for item in catalogue()
        for e in item.evidence
        if e.name == "detected" and e.match is not None and e.match[0] == "detector"
    ]
    assert len(named) >= 15 and set(named) <= set(DETECTORS)
    with pytest.raises(ValueError, match="unknown detector 'nonfinite_gard'"):
        parse_evidence("detected[detector=nonfinite_gard]")


def _claimed_in_source() -> set[str]:
    """Detector names written as literals in the reference trainer: ``Detected(detector=
    "...")`` or ``emit("detected", detector="...")`` or a ``detector = "..."`` they pass
    on (either side of a conditional), and
    the ``name`` of every class that is a detector or a document stage (their claims
    carry it)."""
    found: set[str] = set()
    for path in (ROOT / "reference_trainer").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            typed = isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Detected"
            emitted = (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") == "emit"
                and bool(node.args)
                and getattr(node.args[0], "value", None) == "detected"
            )
            if isinstance(node, ast.Call) and (typed or emitted):
                for kw in node.keywords:
                    value = kw.value
                    sides = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
                    if kw.arg == "detector":
                        found |= {v.value for v in sides if isinstance(v, ast.Constant)}
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") == "detector" for t in node.targets
            ):  # detector = "a" if ... else "b", then Detected(detector=detector)
                value = node.value
                sides = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
                found |= {v.value for v in sides if isinstance(v, ast.Constant)}
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Detector", "Stage")):
                for item in node.body:
                    target = getattr(item, "target", None) or next(
                        iter(getattr(item, "targets", [])), None
                    )
                    value = getattr(item, "value", None)
                    if getattr(target, "id", "") == "name" and isinstance(value, ast.Constant):
                        found.add(value.value)
    return found


def test_the_reference_trainer_claims_only_known_detectors() -> None:
    claimed = _claimed_in_source()
    assert {"nonfinite_guard", "hang_watchdog", "dedup", "robust_zscore", "forecast"} <= claimed
    assert claimed <= set(CLAIMED), claimed - set(CLAIMED)


def test_docs_list_every_detector() -> None:
    doc = (ROOT / "docs" / "journal.md").read_text()
    missing = [name for name in DETECTORS if f"`{name}`" not in doc]
    assert not missing, f"docs/journal.md does not list {missing}"
