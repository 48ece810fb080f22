"""Adaptive warmup: a noisy start warms up at a lower learning rate.

During warmup the learning rate is multiplied by ``1 / (1 + sensitivity * grad_variance)``,
where ``grad_variance`` is half the variance of the log-ratios of successive global gradient
norms over the last ``window`` good steps (the norms agreed across ranks; skipped steps and
non-finite or zero norms left out). Log-ratios, not the norms themselves: during warmup the
norm falls fast (2.3 to 1.1 in the tiny preset's first four steps), and the variance of raw
norms mostly measures that trend. The variance of log-ratios is blind to a steady
exponential trend, and halved it estimates the squared coefficient of variation of norms
that jitter around a level (a log-ratio of two independent draws has twice their variance).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from harness.records.events import Detected
from reference_trainer.errors import ConfigError

NAME = "adaptive_warmup"
PREFIX = f"stability.{NAME}"


@dataclass(kw_only=True, slots=True)
class AdaptiveWarmupConfig:
    """The warmup's learning rate follows the gradient norm's noise."""

    enabled: bool = True
    """Off, warmup is the plain linear ramp whatever the gradients do."""
    window: int = 8
    """Log-ratios of successive gradient norms (so window + 1 norms) the variance is taken over."""
    min_ratios: int = 3
    """Below this many log-ratios the variance is not measured and the factor is 1."""
    sensitivity: float = 10.0
    """The factor is ``1 / (1 + sensitivity * grad_variance)``."""
    claim_below: float = 0.5
    """Journal `detected: grad_variance` when the factor falls below this (once per fall)."""

    def __post_init__(self) -> None:
        for name in ("window", "min_ratios"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 2):
                raise ConfigError(f"{PREFIX}.{name} must be an integer >= 2, got {value!r}")
        if self.min_ratios > self.window:
            raise ConfigError(
                f"{PREFIX}.min_ratios must be <= {PREFIX}.window ({self.window}), "
                f"got {self.min_ratios}"
            )
        if not (math.isfinite(self.sensitivity) and self.sensitivity > 0):
            raise ConfigError(f"{PREFIX}.sensitivity must be > 0, got {self.sensitivity}")
        if not 0 < self.claim_below < 1:
            raise ConfigError(f"{PREFIX}.claim_below must be in (0, 1), got {self.claim_below}")


def log_ratio_variance(norms: list[float]) -> float:
    """Half the (population) variance of ``log(norms[i + 1] / norms[i])``."""
    ratios = [math.log(b / a) for a, b in itertools.pairwise(norms)]
    if not ratios:
        return 0.0
    mean = sum(ratios) / len(ratios)
    return sum((r - mean) ** 2 for r in ratios) / len(ratios) / 2


def warmup_factor(grad_variance: float, sensitivity: float) -> float:
    """``1 / (1 + sensitivity * grad_variance)``."""
    return 1.0 / (1.0 + sensitivity * grad_variance)


@dataclass(slots=True)
class AdaptiveWarmup:
    """The window of recent gradient norms, the factor it gives and the claims it makes."""

    cfg: AdaptiveWarmupConfig
    warmup_steps: int
    norms: deque[float] = field(init=False)
    #: The factor is below `claim_below` and that fall was already journaled.
    claimed: bool = False

    def __post_init__(self) -> None:
        self.norms = deque(maxlen=self.cfg.window + 1)

    def observe(self, grad_norm: float) -> None:
        """Take a good step's global gradient norm (agreed across ranks)."""
        if self.cfg.enabled and math.isfinite(grad_norm) and grad_norm > 0:
            self.norms.append(grad_norm)

    def grad_variance(self) -> float | None:
        """The measured variance, None while too few norms were seen (or when off)."""
        if not self.cfg.enabled or len(self.norms) - 1 < self.cfg.min_ratios:
            return None
        return log_ratio_variance(list(self.norms))

    def factor(self, step: int) -> float:
        """Multiplier on the learning rate of 1-based ``step``: 1 after warmup."""
        variance = self.grad_variance()
        if step > self.warmup_steps or variance is None:
            return 1.0
        return warmup_factor(variance, self.cfg.sensitivity)

    def claim(self, step: int, lr: float) -> Detected | None:
        """`detected: grad_variance` when the factor of ``step`` first falls below
        `claim_below` (again only after it has come back above)."""
        factor = self.factor(step)
        if factor >= self.cfg.claim_below:
            self.claimed = False
            return None
        if self.claimed:
            return None
        self.claimed = True
        details = {
            "grad_variance": self.grad_variance(),
            "factor": factor,
            "lr": lr,
            "norms": list(self.norms),
        }
        return Detected(detector="grad_variance", details=details)

    def reset(self) -> None:
        """Forget every norm seen."""
        self.norms.clear()
        self.claimed = False

    def state_dict(self) -> dict[str, Any]:
        """The window and the claim latch, for checkpoints."""
        return {"norms": list(self.norms), "claimed": self.claimed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output."""
        self.norms = deque((float(n) for n in state["norms"]), maxlen=self.cfg.window + 1)
        self.claimed = bool(state["claimed"])
