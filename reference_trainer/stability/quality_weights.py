"""The rule of quality-weighted sampling (opt-in `quality_sampling`), as pure functions
of plain numbers: per-source loss -> quality score -> bounded sampling weights.

- Relative quality of a source at a good step: ``mean_loss / loss_s``, the token-weighted
  mean loss of the step over every source divided by the source's own mean loss (only
  for a source with at least ``min_tokens`` target tokens in the global batch, and only
  when at least two sources have that many). Above 1, the model predicts this source
  better than the rest of the batch.
- Quality score: ``q_s <- q_s + ema * (relative_s - q_s)``, an exponential moving average
  over good steps, starting at 1; a source absent from a step keeps its score.
- Weights: ``w_s`` proportional to ``base_s * q_s ** power``, each held within
  ``[min_factor, max_factor] * base_s`` *after* normalization (the normalizing constant is
  solved for exactly, `bounded_weights`), so that no source is ever starved or allowed to
  crowd the others out, and a source with base weight 0 stays at 0.

Direction: a source whose loss stays above the rest loses weight (the noisy-source view).
Here a persistently high loss is more likely noise the model cannot learn (a corrupted or
low-quality source, the kind the data faults inject) than learning still to be done; a
learning-progress rule would need the loss's slope, not its level, to tell the two apart.
The bounds keep every source in the mix, so the model does not forget it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reference_trainer.errors import ConfigError

PREFIX = "stability.quality_sampling"


@dataclass(kw_only=True, slots=True)
class QualitySamplingConfig:
    """Sampling weights that follow each source's quality score within bounds."""

    enabled: bool = False
    """Off by default: on, it changes which documents every run trains on."""
    ema: float = 0.1
    """Weight of the newest good step in the quality score's moving average, in (0, 1]."""
    power: float = 2.0
    """Weights are proportional to ``base * quality ** power`` (0: weights stay at base)."""
    min_factor: float = 0.5
    """No source's weight falls below this fraction of its base weight, in (0, 1]."""
    max_factor: float = 2.0
    """No source's weight rises above this multiple of its base weight (>= 1)."""
    min_tokens: int = 32
    """A source with fewer target tokens than this in a step's global batch keeps its score."""
    journal_every: int = 10
    """Journal a `data_weights` event every this many steps (and at the last step)."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"{PREFIX}.enabled must be true or false, got {self.enabled!r}")
        _number(self.ema, "ema", "a number in (0, 1]", lambda v: 0 < v <= 1)
        _number(self.power, "power", "a finite number >= 0", lambda v: 0 <= v < math.inf)
        _number(self.min_factor, "min_factor", "a number in (0, 1]", lambda v: 0 < v <= 1)
        _number(self.max_factor, "max_factor", "a finite number >= 1", lambda v: 1 <= v < math.inf)
        for name in ("min_tokens", "journal_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{PREFIX}.{name} must be a positive integer, got {value!r}")


def _number(value: object, name: str, expected: str, ok: Callable[[float], bool]) -> None:
    good = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (good and ok(float(value))):  # type: ignore[arg-type]
        raise ConfigError(f"{PREFIX}.{name} must be {expected}, got {value!r}")


def relative_quality(
    sums: Sequence[float], counts: Sequence[float], min_tokens: int
) -> list[float | None]:
    """Per source, the step's mean loss over all sources divided by the source's mean
    loss; None for a source with fewer than ``min_tokens`` tokens (or a non-positive loss),
    and for every source when fewer than two have that many (nothing to compare with: a
    step of one source would pull its score to 1 whatever its loss)."""
    total = sum(counts)
    if total <= 0:
        return [None] * len(sums)
    mean = sum(sums) / total
    out: list[float | None] = []
    for loss_sum, count in zip(sums, counts, strict=True):
        own = loss_sum / count if count >= min_tokens else 0.0
        out.append(mean / own if own > 0 and math.isfinite(own) else None)
    if sum(r is not None for r in out) < 2:
        return [None] * len(sums)
    return out


def updated_quality(
    quality: Sequence[float], relative: Sequence[float | None], ema: float
) -> list[float]:
    """The moving average moved toward this step's relative quality (absent: unchanged)."""
    return [q if r is None else q + ema * (r - q) for q, r in zip(quality, relative, strict=True)]


def bounded_weights(
    base: Sequence[float], factors: Sequence[float], low: float, high: float
) -> list[float]:
    """Weights proportional to ``base * factor``, summing to 1, each within
    ``[low, high] * base`` (``low <= 1 <= high``; ``base`` sums to 1).

    Solves for the scale ``c`` with ``sum(base_s * clamp(c * factor_s, low, high)) == 1``:
    the sum is piecewise linear and nondecreasing in ``c``, so the answer lies on the
    segment between two of its breakpoints, found by evaluating them in order.
    """

    def shares(c: float) -> list[float]:
        return [b * min(max(c * f, low), high) for b, f in zip(base, factors, strict=True)]

    points = sorted({x / f for f in factors if f > 0 for x in (low, high)})
    if not points:  # no positive factor: nothing to follow
        return list(base)
    previous, before = points[0], sum(shares(points[0]))
    c = previous if before >= 1 else points[-1]
    if before < 1:
        for point in points[1:]:
            total = sum(shares(point))
            if total >= 1:  # the root lies on this segment, where the sum is linear
                c = previous + (1 - before) * (point - previous) / (total - before)
                break
            previous, before = point, total
    out = shares(c)
    norm = sum(out)
    return [w / norm for w in out]
