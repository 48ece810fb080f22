"""The sampler on a real run: seeded generations of the final checkpoint, named by the
digest the journal recorded at its save, so the collapse check accepts them; after the
final checkpoint is damaged the sampler falls back to an older one, and the check refuses
what it wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.oracles.collapse import PhraseCollapseOracle
from harness.oracles.manifests import sha256_file
from harness.oracles.verdict import Evidence
from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from reference_trainer.sample import main

from .conftest import run_module

pytestmark = pytest.mark.slow
K = 6


def _sample(run_dir: Path, out: Path, seed: int = 0) -> dict[str, object]:
    args = ["--run-dir", str(run_dir), "--k", str(K), "--max-tokens", "12"]
    assert main([*args, "--seed", str(seed), "--out", str(out), "--device", "cpu"]) == 0
    data: dict[str, object] = json.loads(out.read_text())
    return data


def test_generations_name_the_final_weights_and_only_those_count(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_module(
        "-m", "reference_trainer", "--run-dir", str(run_dir), "--steps", "4",
        "--checkpoint-every", "2", "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    layout = RunLayout(run_dir)
    first = _sample(run_dir, layout.samples)
    saves = [e for e in read_journal(run_dir) if e.kind == "checkpoint_saved"]
    final = Path(str(saves[-1].get("path")))
    assert first["step"] == saves[-1].step == 4
    assert first["manifest_sha256"] == saves[-1].get("manifest_sha256")
    assert first["manifest_sha256"] == sha256_file(final / "manifest.json")
    generations = first["generations"]
    assert isinstance(generations, list) and len(generations) == K
    assert _sample(run_dir, tmp_path / "again.json")["generations"] == generations  # seeded
    assert _sample(run_dir, tmp_path / "other.json", seed=1)["generations"] != generations

    # The run is its own baseline: nothing can have risen, and the evidence holds.
    fault = {"kind": "duplicate_contamination", "at_step": 1, "rate": 0.05, "phrase": "the"}
    layout.plan.write_text(json.dumps({"faults": [fault]}))
    shutil.copy(layout.samples, layout.baseline_samples)
    journal = read_journal(run_dir)
    evidence = Evidence(journal=journal, run_dir=run_dir, target_steps=4, baseline=journal)
    check = PhraseCollapseOracle(max_increase=0.0, k=K).judge(evidence)
    assert check.status == "passed" and check.figure == 0, check.detail

    # Damage the final checkpoint: the verified loader falls back to step 2, and
    # generations of those older weights are not taken for the run's final ones.
    state = next(p for p in final.iterdir() if p.name in ("state.pt", "delta.bin"))
    state.write_bytes(state.read_bytes()[:-8])
    older = _sample(run_dir, layout.samples)
    assert older["step"] == 2 and older["rejected"]
    check = PhraseCollapseOracle(max_increase=0.0, k=K).judge(evidence)
    assert check.status == "not judged"
    assert "they name step 2" in check.detail and "step 4" in check.detail
