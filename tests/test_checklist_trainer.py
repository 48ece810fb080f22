"""The checklist against the reference trainer itself: the evidence it names is what the
trainer really journals and records (a NaN gradient's claims, the microscope's arrays),
and a clean run of the same configuration does not emit the fault's items."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.checklist.run_check import check_run
from tests.stability_support import config, run

#: What a NaN gradient in one block must make the run emit, beyond a clean run's items.
FAULT_ITEMS = {"nonfinite-step-guard", "diagnosed-layer", "faults-injected"}
#: What every reference-trainer run emits, fault or not.
ALWAYS = {
    "training-loss",
    "global-grad-norm",
    "learning-rate",
    "layer-grad-norm",
    "update-ratio",
    "weight-norm",
    "activation-histogram",
    "checkpoint-saved",
    "checkpoint-manifest",
    "run-end-status",
}


@pytest.mark.slow
def test_a_nan_gradient_run_emits_its_items_and_a_clean_run_does_not(tmp_path: Path) -> None:
    cfg = config(steps=20)
    run(tmp_path / "nan", cfg, [{"kind": "nan_grad", "at_step": 12, "target": "blocks.0.*"}])
    run(tmp_path / "clean", cfg)
    faulted = {r.item.name for r in check_run(tmp_path / "nan").emitted}
    clean = {r.item.name for r in check_run(tmp_path / "clean").emitted}
    assert ALWAYS | FAULT_ITEMS <= faulted
    assert ALWAYS <= clean and not FAULT_ITEMS & clean
