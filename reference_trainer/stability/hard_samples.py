"""The rule of hard-sample weighting (opt-in `hard_sample_weighting`), as pure functions of
plain numbers: each sample's loss -> its weight in the micro-batch's loss.

- Hardness of a sample (one window of the batch) at a step: its own mean next-token loss
  divided by the run's recent loss (``baseline``: a moving average of the agreed mean loss
  over good steps; `HardSampleState`). Above 1, the model finds this sample harder than
  what it has been seeing.
- Factor: ``hardness ** power``; a sample whose hardness is above ``outlier_factor`` is an
  outlier, its factor 0 (it gets the least weight the bounds allow): a loss far above the
  recent level is more likely noise the model cannot learn than a lesson it can.
- Weights: proportional to the factors, each within ``[min_factor, max_factor]`` of the
  uniform weight, and renormalised so the micro-batch's mean weight is 1 (the rule is
  quality sampling's `bounded_weights`, over samples instead of sources), so the weighted
  loss keeps the scale of the unweighted one and the learning rate keeps its meaning.

When so many samples of a micro-batch are outliers that the rest, held at ``max_factor``,
cannot bring the mean weight to 1, the mean wins and the bounds stretch (measured: 8
outliers in 40 steps of 8-window micro-batches lifted one micro-batch's largest weight to
2.9): the loss keeps its scale, and the outliers still weigh least.

Until the run has a baseline (its first good step), and in a micro-batch with a loss that
is not finite (the non-finite guard's to judge), the weights are uniform.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reference_trainer.errors import ConfigError
from reference_trainer.stability.quality_weights import bounded_weights

PREFIX = "stability.hard_samples"


@dataclass(kw_only=True, slots=True)
class HardSampleConfig:
    """Per-sample loss weights that follow each sample's loss, within bounds."""

    enabled: bool = False
    """Off by default: on, it changes the gradient of every step."""
    power: float = 1.0
    """Weights are proportional to ``hardness ** power`` (0: uniform weights)."""
    min_factor: float = 0.5
    """No sample's weight falls below this fraction of the uniform weight, in (0, 1]."""
    max_factor: float = 2.0
    """No sample's weight rises above this multiple of the uniform weight (>= 1)."""
    outlier_factor: float = 0.0
    """A sample whose loss is above this multiple of the recent loss gets the least weight
    (0: no sample is treated as an outlier; else > 1)."""
    ema: float = 0.1
    """Weight of the newest good step in the recent loss's moving average, in (0, 1]."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"{PREFIX}.enabled must be true or false, got {self.enabled!r}")
        _check(self.power, "power", "a finite number >= 0", lambda v: 0 <= v < math.inf)
        _check(self.min_factor, "min_factor", "a number in (0, 1]", lambda v: 0 < v <= 1)
        _check(self.max_factor, "max_factor", "a finite number >= 1", lambda v: 1 <= v < math.inf)
        _check(
            self.outlier_factor,
            "outlier_factor",
            "0 (off) or a finite number > 1",
            lambda v: v == 0 or 1 < v < math.inf,
        )
        _check(self.ema, "ema", "a number in (0, 1]", lambda v: 0 < v <= 1)


def _check(value: object, name: str, expected: str, ok: Any) -> None:
    good = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (good and ok(float(value))):  # type: ignore[arg-type]
        raise ConfigError(f"{PREFIX}.{name} must be {expected}, got {value!r}")


def sample_weights(
    losses: Sequence[float], baseline: float | None, cfg: HardSampleConfig
) -> tuple[list[float], int]:
    """Each sample's weight (mean 1) and how many were outliers."""
    n = len(losses)
    uniform = [1.0] * n
    if baseline is None or not (math.isfinite(baseline) and baseline > 0):
        return uniform, 0
    if n < 2 or not all(math.isfinite(loss) and loss >= 0 for loss in losses):
        return uniform, 0
    hardness = [loss / baseline for loss in losses]
    cut = cfg.outlier_factor
    outliers = [cut > 0 and h > cut for h in hardness]
    factors = [0.0 if out else h**cfg.power for h, out in zip(hardness, outliers, strict=True)]
    shares = bounded_weights([1.0 / n] * n, factors, cfg.min_factor, cfg.max_factor)
    return [w * n for w in shares], sum(outliers)


@dataclass(slots=True)
class HardSampleState:
    """The run's recent loss, the baseline of hardness (in the checkpoint)."""

    ema: float
    baseline: float | None = None

    def update(self, loss: float) -> None:
        """A good step's agreed mean loss moves the baseline (the first one sets it)."""
        if not math.isfinite(loss):
            return
        if self.baseline is None:
            self.baseline = loss
        else:
            self.baseline += self.ema * (loss - self.baseline)

    def state_dict(self) -> dict[str, Any]:
        """The baseline (a plain float, or None: loads with weights_only)."""
        return {"baseline": self.baseline}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`."""
        saved = state.get("baseline")
        self.baseline = None if saved is None else float(saved)
