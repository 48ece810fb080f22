"""The monitoring checklist: its catalogue is valid and grounded (fault kinds, journal
fields, run-dir files and microscope arrays that exist), a run directory emits exactly the
items whose evidence is on disk, and docs/checklist.md is the catalogue's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from faults import kinds
from harness.checklist import docs
from harness.checklist.catalogue import (
    FILE_EVIDENCE,
    ChecklistError,
    catalogue,
    parse_catalogue,
    parse_evidence,
)
from harness.checklist.run_check import check_run
from harness.records.journal_schema import field_spec
from harness.run_layout import RunLayout
from tests.checklist_support import EMITTED, write_run

ROOT = Path(__file__).resolve().parents[1]


def emitted(run_dir: Path) -> set[str]:
    return {r.item.name for r in check_run(run_dir).emitted}


def test_the_catalogue_has_50_items_grounded_in_what_exists() -> None:
    items = catalogue()
    assert len(items) >= 50
    assert len({i.name for i in items}) == len(items)
    known = set(kinds())
    for item in items:
        assert set(item.faults) <= known, item.name
        for e in item.evidence:
            if e.source == "journal" and e.path:
                assert field_spec(e.name, e.path[0]) is not None, item.name
    # Items this project can show must dominate; every fault kind exercises some item
    # beyond the record of its own injection.
    assert sum(i.showable for i in items) > 0.8 * len(items)
    assert known == {k for i in items if i.name != "faults-injected" for k in i.faults}


def test_file_evidence_names_run_layout_paths() -> None:
    layout = RunLayout("r")
    for attribute, _pattern in FILE_EVIDENCE.values():
        assert isinstance(getattr(layout, attribute), Path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("stepp.loss", "nor a journal event kind"),
        ("step.loss_scal", "no field 'loss_scal'"),
        ("detected[detectr=x]", "no field 'detectr'"),
        ("file:nowhere", "unknown file"),
        ("microscope.grad", "unknown microscope array"),
    ],
)
def test_bad_evidence_is_refused_naming_it(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_evidence(text)


def test_a_bad_entry_is_refused_with_its_item_and_field() -> None:
    good = {
        "name": "a-b",
        "title": "A title",
        "group": "loss",
        "signal": "Something measured",
        "why": "Because it matters to a team.",
        "faults": [],
        "evidence": "step.loss",
    }
    parse_catalogue([good])
    with pytest.raises(ChecklistError, match=r"item 0 \(a-b\)\.faults.*no_such_fault"):
        parse_catalogue([{**good, "faults": ["no_such_fault"]}])
    with pytest.raises(ChecklistError, match=r"item 1 \(x\)\.group.*unknown group"):
        parse_catalogue([good, {**good, "name": "x", "group": "vibes"}])
    with pytest.raises(ChecklistError, match="two items are named 'a-b'"):
        parse_catalogue([good, good])
    with pytest.raises(ChecklistError, match="evidence"):
        parse_catalogue([{**good, "evidence": []}])


def test_a_run_emits_exactly_the_items_whose_evidence_is_on_disk(tmp_path: Path) -> None:
    write_run(tmp_path)
    result = check_run(tmp_path)
    assert {r.item.name for r in result.emitted} == EMITTED
    # evidence: none is never emitted, whatever the run holds.
    assert not any(r.emitted for r in result.results if not r.item.showable)
    found = {r.item.name: r for r in result.results}
    guard = found["nonfinite-step-guard"].found
    assert [(f.evidence, f.count) for f in guard] == [("detected[detector=nonfinite_guard]", 1)]
    assert found["heartbeats"].found[0].detail == "heartbeats/rank-0.json"


@pytest.mark.parametrize(
    ("omit", "flips"),
    [
        ("detected", "nonfinite-step-guard"),
        ("act_max", "activation-max"),
        ("heartbeat", "heartbeats"),
        ("act_hist", "activation-histogram"),
    ],
)
def test_removing_the_evidence_flips_its_item(tmp_path: Path, omit: str, flips: str) -> None:
    write_run(tmp_path, frozenset({omit}))
    assert emitted(tmp_path) == EMITTED - {flips}


def test_not_a_run_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ChecklistError, match="not a run directory"):
        check_run(tmp_path)


def test_docs_checklist_is_written_from_the_catalogue() -> None:
    page = (ROOT / "docs" / "checklist.md").read_text(encoding="utf-8")
    assert page == docs.render(), "regenerate: python -m harness.checklist.docs > docs/checklist.md"
    for item in catalogue():
        assert f"| `{item.name}` |" in page


def test_every_named_detector_and_action_is_one_the_docs_list() -> None:
    # The claims column of docs/stability.md and the detectors of docs/detectors.md name
    # every detector and recovery action the reference trainer journals.
    docs_text = "".join((ROOT / "docs" / n).read_text() for n in ("stability.md", "detectors.md"))
    named = [
        e.match[1]
        for item in catalogue()
        for e in item.evidence
        if e.match is not None and e.match[0] in ("detector", "action")
    ]
    assert len(named) > 25
    words = {w for span in re.findall(r"`([^`]+)`", docs_text) for w in re.findall(r"\w+", span)}
    unknown = [n for n in named if n not in words]
    assert not unknown, f"not a detector or action of docs/stability.md: {unknown}"
