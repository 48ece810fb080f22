"""fp16 mechanisms: dynamic loss scaling with hysteresis, precision switching per block,
and the fp32 retry when the loss scale collapses; each beside its negative control."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from .stability_support import claims, config, final_loss, finite_at_end, near, run

pytestmark = pytest.mark.slow

#: fp16 costs a CPU four times fp32 a step (no fp16 matrix units). The loss-scale tests
#: inject their overflows into the gradients, whatever the batch: they train half the tiny
#: batch, at half the cost. (The activation overflow tests keep it: how far a block's
#: activations climb depends on the batch.)
SMALL_FP16 = {"precision": "fp16", "batch_size": 4}

OVERFLOW = [{"kind": "activation_overflow", "at_step": 8, "duration": 10, "target": "blocks.1.mlp"}]


@pytest.fixture(scope="module")
def clean_fp16(tmp_path_factory: pytest.TempPathFactory) -> float:
    """Final loss of a fault-free 24-step fp16 run."""
    _, journal = run(tmp_path_factory.mktemp("clean") / "run", config(steps=24, precision="fp16"))
    return final_loss(journal)


def test_a_block_near_the_fp16_limit_moves_to_fp32(tmp_path: Path, clean_fp16: float) -> None:
    result, journal = run(tmp_path, config(steps=24, precision="fp16"), OVERFLOW)
    assert result.status == "completed"
    (detected,) = claims(journal, "detected", "activation_range")
    assert detected.step == 8 and detected["details"]["layer"] == "blocks.1"
    assert claims(journal, "recovered", "precision_fp32")[0]["details"]["layer"] == "blocks.1"
    skipped = [s for s, e in journal.steps().items() if e["skipped"]]
    assert skipped == [8]  # only the step that overflowed before the switch
    assert finite_at_end(journal)
    assert near(final_loss(journal), clean_fp16, rel=0.05)


def test_without_fp16_guards_an_overflowing_block_breaks_the_weights(tmp_path: Path) -> None:
    _, journal = run(tmp_path, config(steps=12, precision="fp16", fragile=True), OVERFLOW)
    assert not finite_at_end(journal) and math.isnan(final_loss(journal))


def test_without_precision_switching_every_faulted_step_is_lost(tmp_path: Path) -> None:
    config_ = config(steps=24, precision="fp16", disable=("precision_switch",))
    _, journal = run(tmp_path, config_, OVERFLOW)
    skipped = [s for s, e in journal.steps().items() if e["skipped"]]
    assert skipped == list(range(8, 18))
    assert not claims(journal, "recovered", "precision_fp32")


def test_loss_scale_backs_off_only_after_hysteresis(tmp_path: Path) -> None:
    faults = [
        {"kind": "inf_grad", "at_step": 8},
        {"kind": "inf_grad", "at_step": 12, "duration": 2},
    ]
    result, journal = run(tmp_path, config(steps=16, **SMALL_FP16), faults)
    assert result.status == "completed" and finite_at_end(journal)
    scale = {s: e["loss_scale"] for s, e in journal.steps().items()}
    assert scale[8] == scale[9] == 2.0**16  # one overflow: hysteresis absorbs it
    assert scale[12] == scale[13] == 2.0**16 and scale[14] == 2.0**15  # two: back off
    assert [c.step for c in claims(journal, "detected", "loss_scale_hysteresis")] == [8, 12]
    assert [c.step for c in claims(journal, "detected", "loss_scale_backoff")] == [13]


def test_without_loss_scaling_an_overflow_reaches_the_weights(tmp_path: Path) -> None:
    faults = [{"kind": "inf_grad", "at_step": 8}]
    cfg = config(steps=10, **SMALL_FP16, disable=("loss_scale", "nonfinite_guard", "recovery"))
    _, journal = run(tmp_path, cfg, faults)
    assert journal.steps()[8]["loss_scale"] is None
    assert not finite_at_end(journal)


def test_a_collapsed_loss_scale_retries_in_fp32(tmp_path: Path) -> None:
    cfg = config(steps=24, **SMALL_FP16)
    cfg.stability.loss_scale.min_scale = 2.0**14  # two backoffs from 2**16 reach it
    faults = [{"kind": "inf_grad", "at_step": 12, "duration": 4}]
    result, journal = run(tmp_path, cfg, faults)
    assert result.status == "completed" and finite_at_end(journal)
    (retry,) = claims(journal, "recovered", "fp32_retry")
    details = retry["details"]
    assert details["failure"] == "loss_scale_collapsed" and details["precision"] == "fp32"
    # The steps from the checkpoint to the failure are retried in fp32 (unscaled)...
    steps = journal.steps()
    retried = [steps[s] for s in range(details["resumed_at"] + 1, details["fp32_until"] + 1)]
    assert retried and all(e["loss_scale"] is None for e in retried)
    # ...then the run returns to fp16 with a fresh loss scale, and stays healthy.
    (restored,) = claims(journal, "recovered", "precision_restored")
    assert restored["details"] == {"precision": "fp16", "after_step": details["fp32_until"]}
    later = [e for s, e in steps.items() if s > details["fp32_until"]]
    assert later and all(e["loss_scale"] == 2.0**16 for e in later[:5])
