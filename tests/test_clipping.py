"""Adaptive clipping: the threshold grows with the batch; the embedding gets less of it."""

from __future__ import annotations

import math

import pytest
import torch

from reference_trainer.errors import ConfigError
from reference_trainer.stability.clipping import ClipConfig, clip_gradients, clip_threshold


def _layers(scale: float) -> dict[str, list[torch.nn.Parameter]]:
    torch.manual_seed(0)
    layers = {}
    for name in ("embedding", "attention", "feed_forward"):
        p = torch.nn.Parameter(torch.zeros(100))
        p.grad = torch.randn(100) * scale
        layers[name] = [p]
    return layers


def _norm(params: list[torch.nn.Parameter]) -> float:
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params))  # type: ignore[union-attr]


def test_threshold_grows_with_the_log_of_the_batch() -> None:
    assert clip_threshold(1.0, 1) == 1.0
    assert clip_threshold(2.0, 64) == pytest.approx(2.0 * (1 + math.log(64) / 10))


def test_a_gradient_spike_is_clipped_and_the_embedding_protected() -> None:
    layers = _layers(scale=50.0)  # a spike: each layer's norm ~500
    before, after = clip_gradients(layers, threshold=1.0, factors={"embedding": 0.5})
    assert before > 100
    assert after == pytest.approx(1.0, rel=1e-4)
    every = [p for ps in layers.values() for p in ps]
    assert _norm(every) == pytest.approx(1.0, rel=1e-4)
    assert _norm(layers["embedding"]) <= 0.5 + 1e-6


def test_without_a_layer_factor_the_embedding_takes_its_full_share() -> None:
    """Negative control: the embedding bound above comes from its factor, not by chance."""
    layers = _layers(scale=50.0)
    clip_gradients(layers, threshold=1.0, factors={})
    assert _norm(layers["embedding"]) > 0.5


def test_small_gradients_pass_untouched() -> None:
    layers = _layers(scale=0.001)
    copies = {k: [p.grad.clone() for p in ps] for k, ps in layers.items()}  # type: ignore[union-attr]
    before, after = clip_gradients(layers, threshold=1.0, factors={"embedding": 0.5})
    assert before == pytest.approx(after)
    for name, params in layers.items():
        assert all(torch.equal(p.grad, c) for p, c in zip(params, copies[name], strict=True))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"base": 0.0}, "stability.clipping.base must be > 0"),
        ({"layer_factors": {"head": 0.5}}, "unknown layer 'head'"),
        ({"layer_factors": {"embedding": 1.5}}, "layer_factors.embedding must be in"),
    ],
)
def test_bad_settings_name_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClipConfig(**fields)  # type: ignore[arg-type]
