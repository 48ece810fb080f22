"""Adaptive gradient clipping: a threshold that grows with the batch, tighter for the
embedding, whose rows see few, large updates and blow up first."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from harness.optimizers import OPTIMIZERS
from reference_trainer.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class ClipConfig:
    """Gradient clipping."""

    enabled: bool = True
    """Clip at all; off lets any gradient through."""
    base: float = 1.0
    """Threshold at batch size 1; the threshold is ``base * (1 + log(batch) / 10)``."""
    layer_factors: dict[str, float] = field(default_factory=lambda: {"embedding": 0.5})
    """Per-layer share of the threshold (layers: embedding, attention, feed_forward)."""
    optimizer_factors: dict[str, float] = field(default_factory=lambda: {"adamw8bit": 0.5})
    """Share of the threshold an optimizer gets (others: all of it): 8-bit AdamW's moments
    are quantized per block, so one large gradient coarsens a whole block; half of fp32
    Adam's threshold keeps such gradients out."""

    def __post_init__(self) -> None:
        if not self.base > 0:
            raise ConfigError(f"stability.clipping.base must be > 0, got {self.base}")
        for layer, factor in self.layer_factors.items():
            if layer not in ("embedding", "attention", "feed_forward"):
                raise ConfigError(
                    f"stability.clipping.layer_factors has unknown layer {layer!r}; "
                    "expected embedding, attention or feed_forward"
                )
            if not 0 < factor <= 1:
                raise ConfigError(
                    f"stability.clipping.layer_factors.{layer} must be in (0, 1], got {factor}"
                )
        for name, factor in self.optimizer_factors.items():
            if name not in OPTIMIZERS:
                raise ConfigError(
                    f"stability.clipping.optimizer_factors has unknown optimizer {name!r}; "
                    f"expected some of {', '.join(OPTIMIZERS)}"
                )
            if not 0 < factor <= 1:
                raise ConfigError(
                    f"stability.clipping.optimizer_factors.{name} must be in (0, 1], got {factor}"
                )

    def threshold(self, global_batch: int, optimizer: str) -> float:
        """The global threshold for ``optimizer``: `clip_threshold` times its factor."""
        return clip_threshold(self.base, global_batch) * self.optimizer_factors.get(optimizer, 1.0)


def clip_threshold(base: float, global_batch: int) -> float:
    """``base * (1 + log(global_batch) / 10)``."""
    return base * (1 + math.log(global_batch) / 10)


def _norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    norm: torch.Tensor = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]), 2.0
    )
    return norm


def clip_gradients(
    layers: Mapping[str, Sequence[torch.nn.Parameter]],
    threshold: float,
    factors: Mapping[str, float],
) -> tuple[float, float]:
    """Clip each protected layer to its share of ``threshold``, then the whole to
    ``threshold``. Returns the global norm before and after clipping."""
    grads = {
        layer: [p.grad for p in params if p.grad is not None] for layer, params in layers.items()
    }
    everything = [g for gs in grads.values() for g in gs]
    if not everything:
        return 0.0, 0.0
    before = float(_norm(everything))
    for layer, factor in factors.items():
        limit = threshold * factor
        if grads.get(layer):
            norm = float(_norm(grads[layer]))
            if norm > limit:
                torch._foreach_mul_(grads[layer], limit / (norm + 1e-6))
    total = float(_norm(everything))
    if total > threshold:
        torch._foreach_mul_(everything, threshold / (total + 1e-6))
        total = threshold
    return before, total
