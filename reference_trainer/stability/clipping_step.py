"""Adaptive gradient clipping in the step: before each update, the protected layers are
clipped to their share of the threshold, then the whole (`clip_gradients`)."""

from __future__ import annotations

import torch

from reference_trainer.model.optim import layer_of
from reference_trainer.stability.clipping import ClipConfig, clip_gradients
from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState


class Clipping(Mechanism):
    """Clips the gradients of every update."""

    name = "clipping"

    def __init__(
        self, cfg: ClipConfig, threshold: float, layers: dict[str, list[torch.nn.Parameter]]
    ) -> None:
        self.cfg, self.threshold, self.layers = cfg, threshold, layers

    @classmethod
    def build(cls, ctx: BuildContext) -> Clipping | None:
        """Built when clipping is on: the threshold for the run's batch and optimizer."""
        cfg = ctx.stability.clipping
        if not cfg.enabled:
            return None
        layers: dict[str, list[torch.nn.Parameter]] = {}
        for name, param in ctx.model.named_parameters():
            layers.setdefault(layer_of(name), []).append(param)
        return cls(cfg, cfg.threshold(ctx.global_batch, ctx.optimizer), layers)

    def adjust_gradients(self, s: StepState) -> None:
        """Clip, with the threshold scaled as the step asks (safe mode lowers it)."""
        clip_gradients(self.layers, self.threshold * s.clip_factor, self.cfg.layer_factors)
