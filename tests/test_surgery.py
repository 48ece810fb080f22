"""Gradient surgery (docs/stability.md, `surgery`): the cut on synthetic gradients, safe
mode, and on the trainer a persistent fault that rollback cannot fix but surgery can."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reference_trainer.errors import ConfigError
from reference_trainer.stability.surgery import GradientSurgeon, SurgeryConfig
from tests.stability_support import claims, config, final_loss, near, run


def layer(rows: int = 20, cols: int = 8) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.zeros(rows, cols))


def surgeon_with_history(param: torch.nn.Parameter, **cfg: float) -> GradientSurgeon:
    """A surgeon whose window holds gradients in a 2-dimensional subspace."""
    surgeon = GradientSurgeon(SurgeryConfig(**cfg), {"blocks.0": [param]})  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(0)
    self_a, self_b = (
        torch.randn(param.shape, generator=gen),
        torch.randn(param.shape, generator=gen),
    )
    for i in range(6):
        param.grad = (1 + i) * self_a + (6 - i) * self_b
        surgeon.remember(loss=5.0)
    surgeon.directions = (self_a, self_b)  # type: ignore[attr-defined]
    return surgeon


def test_the_rows_that_carried_the_anomaly_are_cut_and_what_is_left_lies_in_the_normal_span() -> (
    None
):
    param = layer()
    surgeon = surgeon_with_history(param)
    a, b = surgeon.directions  # type: ignore[attr-defined]
    clean = 2 * a + 3 * b
    grad = clean.clone()
    grad[[3, 11]] += 1e4  # two rows of a corrupted gradient
    corrupted = float(grad.norm())
    param.grad = grad
    details = surgeon.operate("blocks.0", median_norm=float(clean.norm()), step=30)
    repaired = param.grad
    assert repaired is not None
    assert not repaired[[3, 11]].any()  # the corrupted rows receive nothing
    kept = [r for r in range(param.shape[0]) if r not in (3, 11)]
    cosine = torch.nn.functional.cosine_similarity(
        repaired[kept].flatten(), clean[kept].flatten(), dim=0
    )
    assert float(cosine) > 0.99  # the rest points where the clean gradient does
    assert float(repaired.norm()) <= float(clean.norm()) * 1.0001
    assert details["rows_frozen"] == 2 and details["anomalous_share"] > 0.9
    # Negative control: the corrupted gradient itself was far outside the bound.
    assert corrupted > 100 * float(clean.norm())


def test_non_finite_rows_are_cut_and_the_rest_kept_finite() -> None:
    param = layer()
    surgeon = surgeon_with_history(param)
    a, b = surgeon.directions  # type: ignore[attr-defined]
    grad = a + b
    grad[7, 2] = float("nan")
    grad[9] = float("inf")
    param.grad = grad
    details = surgeon.operate("blocks.0", median_norm=float((a + b).norm()), step=30)
    assert param.grad is not None and bool(torch.isfinite(param.grad).all())
    assert not param.grad[[7, 9]].any() and details["non_finite_rows"] == 2


def test_safe_mode_lowers_lr_and_clip_until_the_layer_calms_down() -> None:
    param = layer()
    surgeon = surgeon_with_history(param, dropout_steps=2, calm_steps=3, ramp_steps=2)
    param.grad = torch.full(param.shape, 1e3)
    surgeon.operate("blocks.0", median_norm=1.0, step=10)
    assert (surgeon.lr_factor, surgeon.clip_factor) == (0.5, 0.5)
    # Still wild: safe mode stays on, however long.
    assert [surgeon.end_step(s, 50.0, 1.0) for s in range(11, 20)] == [None] * 9
    factors = []
    for s in range(20, 25):  # three calm steps, then the climb back over two
        ended = surgeon.end_step(s, 1.5, 1.0)
        factors.append(round(surgeon.lr_factor, 3))
    assert factors == [0.5, 0.5, 0.667, 0.833, 1.0] and ended == 14
    assert surgeon.safe_layer is None and surgeon.clip_factor == 1.0


def test_a_step_whose_loss_already_rose_is_left_to_rollback() -> None:
    surgeon = surgeon_with_history(layer())
    assert surgeon.forward_was_normal(5.5) and not surgeon.forward_was_normal(7.0)


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"stability\.surgery\.safe_lr"):
        SurgeryConfig(safe_lr=0.0)
    with pytest.raises(ConfigError, match=r"stability\.surgery\.window"):
        SurgeryConfig(window=0)


FOR_GOOD = [{"kind": "inf_grad", "target": "blocks.1.attn.*", "at_step": 15, "every": 1}]


@pytest.mark.slow
def test_surgery_carries_a_run_through_a_lasting_gradient_fault(tmp_path: Path) -> None:
    """One attention's gradients are infinite at every step from 15 on: every rollback
    meets the fault again, so without surgery recovery runs out; with it the run completes
    with that layer's bad rows cut, close to a clean run."""
    _, clean = run(tmp_path / "clean", config(steps=40))
    result, journal = run(tmp_path / "with", config(steps=40), FOR_GOOD)
    assert result.status == "completed"
    operations = claims(journal, "recovered", "gradient_surgery")
    on_block = [c.step for c in operations if c["details"]["layer"] == "blocks.1"]
    assert on_block == list(range(15, 41))  # every step of the fault, none lost
    # The agent saw it too: infinite gradients after backward, finite at the update.
    repaired = [s for s, e in journal.steps().items() if e.get("grads_repaired")]
    assert repaired == list(range(15, 41))
    assert not claims(journal, "recovered", "rollback")
    assert near(final_loss(journal), final_loss(clean), rel=0.02)
    without, bare = run(tmp_path / "without", config(steps=40, disable=("surgery",)), FOR_GOOD)
    assert without.status == "failed"
    assert claims(bare, "detected", "recovery_exhausted")
