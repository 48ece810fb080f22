"""Dynamic loss scaling for fp16, with hysteresis as DeepSpeed does it.

The loss is multiplied by ``scale`` before backward so small gradients survive fp16;
gradients are divided by it again before the optimizer sees them. A step whose
gradients overflow is skipped. The scale backs off only after ``hysteresis`` overflows
without a good step in between (one stray overflow does not halve it), and grows after
``growth_interval`` good steps in a row. A scale that has collapsed to ``min_scale``
means fp16 cannot carry this model any more: the recovery policy retries in fp32.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from reference_trainer.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class LossScaleConfig:
    """Dynamic loss scaling (fp16 only)."""

    enabled: bool = True
    """Scale the loss dynamically; off means fp16 trains unscaled (scale 1)."""
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 200
    """Good steps in a row before the scale grows."""
    hysteresis: int = 2
    """Overflows tolerated before the scale backs off (reset by a good step)."""
    min_scale: float = 1.0
    """At or below this the scale has collapsed (escalates to an fp32 retry)."""

    def __post_init__(self) -> None:
        if not self.init_scale >= self.min_scale > 0:
            raise ConfigError("stability.loss_scale needs init_scale >= min_scale > 0")
        if not (self.growth_factor > 1 and 0 < self.backoff_factor < 1):
            raise ConfigError(
                "stability.loss_scale.growth_factor must be > 1 and backoff_factor in (0, 1)"
            )
        if self.growth_interval < 1 or self.hysteresis < 1:
            raise ConfigError("stability.loss_scale.growth_interval and hysteresis must be >= 1")


@dataclass(frozen=True, slots=True)
class ScaleChange:
    """What `DynamicLossScaler.update` did, for the journal."""

    action: str  # "backoff", "growth", "hysteresis" or "raised"
    old: float
    new: float
    hysteresis_left: int


class DynamicLossScaler:
    """Scales the loss, unscales gradients, and adapts the scale to overflows."""

    def __init__(self, config: LossScaleConfig, active: bool) -> None:
        self.config = config
        self.active = active and config.enabled
        self.scale = config.init_scale if self.active else 1.0
        self.good_steps = 0
        self.hysteresis_left = config.hysteresis

    def reset(self) -> None:
        """Start over from the initial scale (an fp32 retry hands back to fp16)."""
        self.scale = self.config.init_scale if self.active else 1.0
        self.good_steps = 0
        self.hysteresis_left = self.config.hysteresis

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on."""
        return loss * self.scale if self.active else loss

    def unscale_(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Divide every gradient by the scale, in place."""
        if not self.active:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)

    def update(self, overflow: bool) -> ScaleChange | None:
        """Adapt after a step; returns the change when the scale (or hysteresis) moved."""
        if not self.active:
            return None
        cfg, old = self.config, self.scale
        if overflow:
            self.good_steps = 0
            if self.hysteresis_left > 1:
                self.hysteresis_left -= 1
                return ScaleChange("hysteresis", old, old, self.hysteresis_left)
            self.scale = max(old * cfg.backoff_factor, cfg.min_scale)
            self.hysteresis_left = cfg.hysteresis
            return ScaleChange("backoff", old, self.scale, self.hysteresis_left)
        self.hysteresis_left = cfg.hysteresis
        self.good_steps += 1
        if self.good_steps >= cfg.growth_interval:
            self.good_steps = 0
            self.scale = old * cfg.growth_factor
            return ScaleChange("growth", old, self.scale, self.hysteresis_left)
        return None

    def raise_scale(self, limit: float) -> ScaleChange | None:
        """Grow the scale once, up to ``limit``, so that gradients flushed to zero in fp16
        come back into range; None when inactive or already at the limit."""
        if not self.active or self.scale >= limit:
            return None
        old = self.scale
        self.scale = min(old * self.config.growth_factor, limit)
        self.good_steps = 0
        return ScaleChange("raised", old, self.scale, self.hysteresis_left)

    @property
    def collapsed(self) -> bool:
        """True when the scale has fallen to its minimum."""
        return self.active and self.scale <= self.config.min_scale

    def current(self) -> float | None:
        """The scale for the journal; None when the loss is not scaled."""
        return self.scale if self.active else None

    def state_dict(self) -> dict[str, Any]:
        """Scale and counters, for checkpoints."""
        return {
            "scale": self.scale,
            "good_steps": self.good_steps,
            "hysteresis_left": self.hysteresis_left,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.hysteresis_left = int(state["hysteresis_left"])
