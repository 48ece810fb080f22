"""The rule of hard-sample weighting (`reference_trainer/stability/hard_samples.py`): weights
follow each sample's loss within bounds and average 1, outliers get the least, and the
baseline they are judged by is saved and restored; the mechanism's loss is the weighted
mean and, switched off, the step's loss is the very tensor the passes computed."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from reference_trainer.errors import ConfigError
from reference_trainer.model.gpt import next_token_loss
from reference_trainer.stability.hard_sample_step import HardSampleWeighting
from reference_trainer.stability.hard_samples import (
    HardSampleConfig,
    HardSampleState,
    sample_weights,
)
from reference_trainer.stability.mechanism import Mechanism


def test_harder_samples_weigh_more_within_bounds_and_the_mean_weight_is_one() -> None:
    cfg = HardSampleConfig(enabled=True, power=1.0, min_factor=0.5, max_factor=2.0)
    losses = [2.0, 3.0, 4.0, 5.0, 3.0, 30.0]
    weights, outliers = sample_weights(losses, 4.0, cfg)
    assert outliers == 0
    assert math.isclose(sum(weights) / len(weights), 1.0)
    assert all(0.5 - 1e-12 <= w <= 2.0 + 1e-12 for w in weights)
    assert weights[0] < weights[1] < weights[2] < weights[3] < weights[5]  # as the losses
    assert weights[1] == weights[4]
    assert math.isclose(weights[5], 2.0)  # held at the bound, not 15x the first
    # Below the bound the weights are proportional to the losses.
    assert weights[3] / weights[1] == pytest.approx(5.0 / 3.0)
    assert math.isclose(weights[0], 0.5)  # and at the lower bound for the easiest


def test_the_baseline_only_decides_which_samples_are_outliers() -> None:
    """Weights are renormalised, so scaling every hardness alike changes nothing: the
    recent loss matters through the outlier cut."""
    cfg = HardSampleConfig(enabled=True)
    losses = [3.0, 4.0, 5.0, 9.0]
    assert sample_weights(losses, 4.0, cfg)[0] == pytest.approx(sample_weights(losses, 8.0, cfg)[0])
    cut = HardSampleConfig(enabled=True, outlier_factor=1.5)
    weights, outliers = sample_weights(losses, 4.0, cut)  # 9 > 1.5 x 4: an outlier
    assert outliers == 1
    assert weights[3] == pytest.approx(min(weights)) and weights[3] == pytest.approx(0.5)
    assert weights[3] < weights[0]  # below even the easiest sample
    assert math.isclose(sum(weights) / len(weights), 1.0)
    assert sample_weights(losses, 8.0, cut)[1] == 0  # 9 < 1.5 x 8: none


def test_with_most_samples_outliers_the_mean_weight_stays_one_and_the_bounds_stretch() -> None:
    cut = HardSampleConfig(enabled=True, outlier_factor=1.2, max_factor=2.0)
    weights, outliers = sample_weights([9.0, 9.0, 9.0, 4.0], 4.0, cut)
    assert outliers == 3
    assert math.isclose(sum(weights) / len(weights), 1.0)
    assert weights[3] > 2.0 and weights[0] < weights[3]  # 0.5 x 3 + 2 < 4: stretched


@pytest.mark.parametrize(
    ("losses", "baseline"),
    [([1.0, 2.0], None), ([1.0, math.nan], 1.5), ([1.0, math.inf], 1.5), ([3.0], 1.0)],
)
def test_without_a_baseline_or_with_a_loss_not_finite_the_weights_are_uniform(
    losses: list[float], baseline: float | None
) -> None:
    cfg = HardSampleConfig(enabled=True, outlier_factor=1.2)
    assert sample_weights(losses, baseline, cfg) == ([1.0] * len(losses), 0)


def test_power_zero_is_uniform() -> None:
    cfg = HardSampleConfig(enabled=True, power=0.0)
    weights, _ = sample_weights([1.0, 5.0, 9.0], 3.0, cfg)
    assert weights == pytest.approx([1.0, 1.0, 1.0])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("min_factor", 0.0, "stability.hard_samples.min_factor must be a number in (0, 1]"),
        ("max_factor", 0.5, "stability.hard_samples.max_factor must be a finite number >= 1"),
        ("outlier_factor", 0.9, "stability.hard_samples.outlier_factor must be 0 (off) or"),
        ("power", -1.0, "stability.hard_samples.power must be a finite number >= 0"),
        ("ema", True, "stability.hard_samples.ema must be a number in (0, 1]"),
        ("enabled", "yes", "stability.hard_samples.enabled must be true or false"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HardSampleConfig(**{field: value})  # type: ignore[arg-type]


def test_the_recent_loss_follows_good_steps_and_survives_a_checkpoint() -> None:
    state = HardSampleState(ema=0.5)
    state.update(4.0)
    assert state.baseline == 4.0
    state.update(math.nan)  # a loss that is not finite moves nothing
    state.update(2.0)
    assert state.baseline == 3.0
    restored = HardSampleState(ema=0.5)
    restored.load_state_dict(state.state_dict())
    assert restored.baseline == 3.0
    fresh = HardSampleState(ema=0.5)
    fresh.load_state_dict({})
    assert fresh.baseline is None


def test_the_weighted_loss_weighs_each_sample_and_off_the_loss_is_untouched() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 11, requires_grad=True)
    targets = torch.randint(0, 11, (4, 6))
    loss = next_token_loss(logits, targets)
    assert (
        Mechanism.weigh_loss(HardSampleWeighting(HardSampleConfig()), 0, logits, targets, loss)
        is loss
    )
    mech = HardSampleWeighting(HardSampleConfig(enabled=True, power=1.0))
    # No baseline yet: uniform weights, the same mean to float rounding.
    assert float(mech.weigh_loss(0, logits, targets, loss).detach()) == pytest.approx(
        float(loss.detach()), rel=1e-6
    )
    mech.state.baseline = float(loss.detach())
    per_sample = F.cross_entropy(logits.view(-1, 11), targets.view(-1), reduction="none").view(4, 6)
    losses = per_sample.mean(1).tolist()
    weights, _ = sample_weights(losses, float(loss.detach()), mech.cfg)
    expected = sum(w * x for w, x in zip(weights, losses, strict=True)) / 4
    weighted = mech.weigh_loss(0, logits, targets, loss)
    assert float(weighted.detach()) == pytest.approx(expected, rel=1e-6)
    assert float(weighted.detach()) > float(loss.detach())  # the harder samples count for more
    weighted.backward()  # type: ignore[no-untyped-call]
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
