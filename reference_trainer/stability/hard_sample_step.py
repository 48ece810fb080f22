"""Hard-sample weighting in the step (opt-in, docs/stability.md): each micro-batch's loss
for the backward pass is the weighted mean of its samples' losses, the weights from each
sample's loss against the run's recent loss within bounds (`hard_samples`); the step's
reported loss stays the unweighted mean, so detectors and the journal read what they did."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from reference_trainer.stability.hard_samples import (
    HardSampleConfig,
    HardSampleState,
    sample_weights,
)
from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState


class HardSampleWeighting(Mechanism):
    """Weights each sample's loss by its hardness; keeps the recent loss it is judged by."""

    name = "hard_sample_weighting"
    state_keys = ("hard_samples",)

    def __init__(self, cfg: HardSampleConfig) -> None:
        self.cfg = cfg
        self.state = HardSampleState(cfg.ema)
        self._largest = math.nan
        self._outliers = 0

    @classmethod
    def build(cls, ctx: BuildContext) -> HardSampleWeighting | None:
        """Built when switched on (never with dynamic batching: the config refuses it)."""
        cfg = ctx.stability.hard_samples
        return cls(cfg) if cfg.enabled else None

    def begin_step(self, s: StepState) -> None:
        """A new step: nothing weighted yet."""
        self._largest, self._outliers = math.nan, 0

    def weigh_loss(
        self, micro: int, logits: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor
    ) -> torch.Tensor:
        """The weighted mean of the micro-batch's per-sample losses."""
        per_token = F.cross_entropy(
            logits.float().view(-1, logits.size(-1)), targets.reshape(-1), reduction="none"
        )
        per_sample = per_token.view(targets.shape).mean(dim=1)  # (B,)
        losses = [float(v) for v in per_sample.detach().tolist()]
        weights, outliers = sample_weights(losses, self.state.baseline, self.cfg)
        self._largest = max(weights) if math.isnan(self._largest) else max(self._largest, *weights)
        self._outliers += outliers
        w = torch.tensor(weights, dtype=per_sample.dtype, device=per_sample.device)
        return (per_sample * w).mean()

    def end_step(self, s: StepState) -> None:
        """A good step moves the recent loss; the step's largest weight and outliers."""
        if not s.skip:
            self.state.update(s.loss)
        s.observed["sample_weight_max"] = self._largest
        s.observed["samples_excluded"] = self._outliers

    def state_dict(self) -> dict[str, Any]:
        """The recent loss."""
        return {"hard_samples": self.state.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The recent loss saved with the checkpoint (absent: none yet)."""
        self.state.load_state_dict(state.get("hard_samples") or {})
