"""The collapse check: the share of generations holding the contamination's phrase, against
the baseline's, judged only from generations proven to be of each run's last checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.oracles import build_oracles
from harness.oracles.collapse import (
    PhraseCollapseExpect,
    PhraseCollapseOracle,
    contains,
    planted_phrase,
)
from harness.oracles.verdict import Evidence
from harness.run_layout import RunLayout
from harness.suites.scenario import Expect

from .oracle_runs import TARGET, Run

PHRASE = "Ten stars, buy it now"
K = 20


def _saved_run(run_dir: Path, *, manifest: bytes = b'{"step": 30}') -> tuple[Run, str]:
    """A finished run whose last checkpoint is on disk; returns it and the digest journaled."""
    ckpt = RunLayout(run_dir).checkpoints / f"step-{TARGET:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_bytes(manifest)
    digest = hashlib.sha256(manifest).hexdigest()
    run = Run(run_dir).steps(1, 10).emit("checkpoint_saved", 10, path=str(ckpt.parent / "x"))
    run.steps(11, TARGET).emit("checkpoint_saved", TARGET, path=str(ckpt), manifest_sha256=digest)
    return run.end(), digest


def _plan(run_dir: Path, phrase: str | None = PHRASE) -> None:
    fault = {"kind": "duplicate_contamination", "at_step": 1, "rate": 0.05, "pool": 1}
    if phrase is not None:
        fault["phrase"] = phrase
    RunLayout(run_dir).plan.write_text(json.dumps({"faults": [fault]}))


def _samples(path: Path, hits: int, *, k: int = K, step: int = TARGET, **ids: str) -> None:
    texts = [f"a review ... {PHRASE.upper()}  today" if i < hits else "a review" for i in range(k)]
    path.write_text(json.dumps({"format": 1, "step": step, "generations": texts, **ids}))


def _evidence(tmp_path: Path, faulted_hits: int, baseline_hits: int) -> Evidence:
    run, digest = _saved_run(tmp_path / "run")
    base, base_digest = _saved_run(tmp_path / "base", manifest=b'{"step": 30, "b": 1}')
    _plan(run.run_dir)
    layout = RunLayout(run.run_dir)
    _samples(layout.samples, faulted_hits, manifest_sha256=digest)
    _samples(layout.baseline_samples, baseline_hits, manifest_sha256=base_digest)
    return run.evidence(base)


def test_a_collapsed_run_fails(tmp_path: Path) -> None:
    check = PhraseCollapseOracle(max_increase=0.1, k=K).judge(_evidence(tmp_path, 16, 1))
    assert check.status == "failed"
    assert check.figure == pytest.approx(0.75)  # 16/20 - 1/20
    assert (check.figures["share"], check.figures["baseline_share"]) == (0.8, 0.05)
    assert "16 of 20 generations (80.0%) hold 'Ten stars, buy it now'" in check.detail
    assert "against 1 (5.0%) of the fault-free baseline's" in check.detail


def test_a_clean_run_passes(tmp_path: Path) -> None:
    check = PhraseCollapseOracle(max_increase=0.1, k=K).judge(_evidence(tmp_path, 2, 1))
    assert check.status == "passed", check.detail
    assert check.figure == pytest.approx(0.05)


def test_the_bound_is_inclusive_and_binds(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path, 3, 1)  # an increase of exactly 0.1
    assert PhraseCollapseOracle(max_increase=0.1, k=K).judge(evidence).passed
    assert not PhraseCollapseOracle(max_increase=0.05, k=K).judge(evidence).passed


@pytest.mark.parametrize("which", ["samples", "baseline_samples"])
def test_missing_generations_are_not_judged(tmp_path: Path, which: str) -> None:
    evidence = _evidence(tmp_path, 16, 0)
    getattr(RunLayout(evidence.run_dir), which).unlink()
    check = PhraseCollapseOracle(k=K).judge(evidence)
    assert check.status == "not judged" and not check.passed
    assert "is missing (the sampler wrote none" in check.detail


def test_a_mismatched_checkpoint_digest_is_refused(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path, 16, 0)
    _samples(RunLayout(evidence.run_dir).samples, 0, manifest_sha256="ab" * 32)
    check = PhraseCollapseOracle(k=K).judge(evidence)
    assert check.status == "not judged"
    assert "not known to be of its final weights" in check.detail
    assert "not the last checkpoint saved, step 30" in check.detail


def test_generations_of_an_older_checkpoint_are_refused(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path, 16, 0)
    digest = json.loads(RunLayout(evidence.run_dir).samples.read_text())["manifest_sha256"]
    _samples(RunLayout(evidence.run_dir).samples, 0, step=10, manifest_sha256=digest)
    check = PhraseCollapseOracle(k=K).judge(evidence)
    assert check.status == "not judged" and "they name step 10" in check.detail


def test_a_manifest_changed_on_disk_since_its_save_is_refused(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path, 0, 0)
    manifest = RunLayout(evidence.run_dir).checkpoints / f"step-{TARGET:08d}" / "manifest.json"
    manifest.write_bytes(b'{"step": 30, "swapped": true}')
    check = PhraseCollapseOracle(k=K).judge(evidence)
    assert check.status == "not judged"
    assert "no longer hashes to the digest journaled at its save" in check.detail


def test_generations_that_name_no_checkpoint_are_refused(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path, 0, 0)
    _samples(RunLayout(evidence.run_dir).baseline_samples, 0)
    check = PhraseCollapseOracle(k=K).judge(evidence)
    assert check.status == "not judged" and "name no checkpoint" in check.detail


def test_fewer_generations_than_asked_are_not_judged(tmp_path: Path) -> None:
    check = PhraseCollapseOracle(k=K + 1).judge(_evidence(tmp_path, 0, 0))
    assert check.status == "not judged" and "wrote 20 generations, not the 21" in check.detail


def test_no_phrase_in_the_plan_is_not_judged(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path, 16, 0)
    _plan(evidence.run_dir, phrase=None)
    assert planted_phrase(evidence.run_dir) is None
    check = PhraseCollapseOracle(k=K).judge(evidence)
    assert check.status == "not judged" and "plants a phrase" in check.detail


def test_no_baseline_is_not_judged(tmp_path: Path) -> None:
    run, digest = _saved_run(tmp_path / "run")
    _plan(run.run_dir)
    _samples(RunLayout(run.run_dir).samples, 0, manifest_sha256=digest)
    check = PhraseCollapseOracle(k=K).judge(run.evidence())
    assert check.status == "not judged" and "no fault-free baseline" in check.detail


def test_a_command_trainers_generations_match_the_last_file_it_saved(tmp_path: Path) -> None:
    run = Run(tmp_path / "run").steps(1, TARGET)
    run.emit("file_saved", TARGET, path="ckpt.pt", sha256="cd" * 32).end()
    base = Run(tmp_path / "base").steps(1, TARGET)
    base.emit("file_saved", TARGET, path="ckpt.pt", sha256="ef" * 32).end()
    _plan(run.run_dir)
    layout = RunLayout(run.run_dir)
    _samples(layout.samples, 12, file_sha256="cd" * 32)
    _samples(layout.baseline_samples, 0, file_sha256="ef" * 32)
    check = PhraseCollapseOracle(k=K).judge(run.evidence(base))
    assert check.status == "failed" and check.figure == pytest.approx(0.6)
    _samples(layout.samples, 12, file_sha256="00" * 32)
    check = PhraseCollapseOracle(k=K).judge(run.evidence(base))
    assert check.status == "not judged" and "not the last file saved" in check.detail


def test_the_phrase_is_found_whatever_its_case_and_spacing() -> None:
    assert contains("... ten  STARS,\nbuy it now!", PHRASE)
    assert not contains("ten stars, buy it later", PHRASE)


def test_the_expectation_builds_the_oracle_and_asks_for_a_baseline() -> None:
    expect = Expect(max_phrase_collapse={"max_increase": 0.2, "k": 32})
    assert build_oracles(expect) == [PhraseCollapseOracle(max_increase=0.2, k=32)]
    assert expect.needs_baseline()


@pytest.mark.parametrize(
    ("bad", "field"), [({"max_increase": 1.5}, "max_increase"), ({"k": 0}, "k")]
)
def test_bad_expectations_are_refused_naming_the_field(bad: dict[str, float], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        PhraseCollapseExpect.model_validate(bad)
