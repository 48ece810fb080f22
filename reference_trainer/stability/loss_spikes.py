"""Loss-spike detectors: three ways to tell a spike from the noise of a falling loss curve.

Each sees one loss per optimizer step through ``observe(step, loss)`` and returns a
`SpikeClaim` when it fires; a non-finite loss fires all of them (``non_finite=1``).
`SpikeMonitor` runs the enabled ones and says whether an acting one fired.

- ``robust_zscore``: robust z-score of the change ``loss - last accepted loss`` against the
  median and 1.4826·MAD of the changes within a rolling window of accepted losses. Changes,
  not levels: on a falling curve a 50-step window's median sits above the current loss by
  more than a 2x spike adds. Losses over the threshold never enter the window; ``patience``
  consecutive exceedances are needed to fire. A level shift (a sustained jump whose single
  step is too small to score) is caught apart: the median of the last ``level_window``
  accepted losses against the median of the ``level_window`` before them, in standard errors
  of that difference; once it fires, the next ``2·level_window`` steps are the new level's.
- ``early_max``: Megatron-LM's spiky-loss rule: fire when |loss| exceeds ``factor`` times the
  largest |loss| of the first ``early_steps`` steps observed. Blind to anything smaller.
- ``forecast``: a one-layer LSTM, trained online (a few Adam steps per step) on the run's
  own recent losses, predicts the next ``horizon`` losses from the last ``context``. The
  forecasts made for step t give a band ``mean ± sigma_k·σ``, σ combining their spread with
  the recent forecast error; it fires outside the band, above or below (the claim's
  ``side``), and learns from the forecast instead of the outlier. It draws no global random
  numbers and leaves torch's threads as they are.

``reset()`` forgets everything; ``load_state_dict`` continues exactly where
``state_dict`` left off.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reference_trainer.stability.loss_forecast import ForecastConfig, ForecastDetector
from reference_trainer.stability.spike_claims import (
    NAMES,
    SIDES,
    LossSpikeDetector,
    Side,
    SpikeClaim,
)
from reference_trainer.stability.spike_claims import PREFIX as _PREFIX
from reference_trainer.stability.spike_claims import check as _check
from reference_trainer.stability.spike_claims import claim as _claim
from reference_trainer.stability.spike_claims import same_detector as _same_detector

__all__ = [
    "NAMES",
    "EarlyMaxConfig",
    "EarlyMaxDetector",
    "ForecastConfig",
    "ForecastDetector",
    "LossSpikeDetector",
    "RobustZScoreConfig",
    "RobustZScoreDetector",
    "SpikeClaim",
    "SpikeConfig",
    "SpikeMonitor",
    "build_detectors",
]

_SMALL_SAMPLE = 150.0  # robust_zscore: 3 false alarms in 570k simulated clean steps at z > 6


# -- robust z-score -----------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class RobustZScoreConfig:
    """Robust z-score of the change Δ = loss - last accepted loss against the n changes
    within the window: ``z = (Δ - median) / (1.4826·MAD·(1 + 150/n²) + eps)``. The factor
    widens short windows, whose MAD too often understates the spread (x2.9 at n = 9)."""

    window: int = 50
    """Accepted losses kept; their successive differences give the median and MAD."""
    z_threshold: float = 6.0
    """A change scoring above this is an exceedance."""
    patience: int = 1
    """Consecutive exceedances needed to fire."""
    min_history: int = 10
    """Accepted losses needed before it may fire."""
    eps: float = 1e-8
    """Added to the scale."""
    rel_floor: float = 1e-3
    """Lower bound on the scale as a fraction of the last accepted loss (flat curves)."""
    level_window: int = 15
    """Accepted losses whose median is held against the median of as many before them (a
    level shift); 0 turns the level check off."""
    level_threshold: float = 6.0
    """A rise of the recent median over the earlier one, in standard errors of that
    difference, above which the level check fires."""

    def __post_init__(self) -> None:
        p = "robust."
        _check(self.window >= 8, p + "window", ">= 8", self.window)
        _check(self.z_threshold > 0, p + "z_threshold", "> 0", self.z_threshold)
        _check(self.patience >= 1, p + "patience", ">= 1", self.patience)
        ok = 3 <= self.min_history <= self.window
        _check(ok, p + "min_history", f"in [3, window={self.window}]", self.min_history)
        _check(self.eps >= 0, p + "eps", ">= 0", self.eps)
        _check(self.rel_floor >= 0, p + "rel_floor", ">= 0", self.rel_floor)
        ok = self.level_window == 0 or 3 <= self.level_window <= self.window // 2
        rule = f"0 or in [3, window/2={self.window // 2}]"
        _check(ok, p + "level_window", rule, self.level_window)
        _check(self.level_threshold > 0, p + "level_threshold", "> 0", self.level_threshold)


class RobustZScoreDetector:
    """Fires when a loss jumps far above the window's typical step-to-step change, or when
    the recent losses sit well above the ones before them (a level shift)."""

    name: str = "robust_zscore"

    def __init__(self, config: RobustZScoreConfig | None = None) -> None:
        self.config = config or RobustZScoreConfig()
        self.window: deque[float] = deque(maxlen=self.config.window)
        self.count = 0
        self.quiet = 0  # steps left in which the level check keeps still (after it fired)

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Score the change from the last accepted loss; a claim after `patience` in a row."""
        cfg = self.config
        if not math.isfinite(loss):
            return _claim(self.name, step, loss, non_finite=1)
        if len(self.window) < cfg.min_history:
            self.window.append(loss)
            return None
        diffs = np.diff(np.fromiter(self.window, dtype=np.float64))
        median = float(np.median(diffs))
        mad = float(np.median(np.abs(diffs - median)))
        baseline = self.window[-1]
        widen = 1 + _SMALL_SAMPLE / len(diffs) ** 2
        scale = max(1.4826 * mad * widen, cfg.rel_floor * abs(baseline)) + cfg.eps
        z = (loss - baseline - median) / scale
        if z <= cfg.z_threshold:
            self.count = 0
            self.window.append(loss)
            return self._level(step, loss, mad)
        self.count += 1
        if self.count < cfg.patience:
            return None
        return _claim(
            self.name, step, loss, non_finite=0, baseline=baseline, median=median, mad=mad,
            scale=scale, z=z, threshold=cfg.z_threshold, patience_count=self.count,
        )  # fmt: skip

    def _level(self, step: int, loss: float, mad: float) -> SpikeClaim | None:
        """The level check, once ``loss`` is accepted: the recent median against the one
        before it, scaled by the standard error of their difference (the noise of one loss
        is 1.4826·MAD/√2 of the changes; a median of k losses has 1.2533·σ/√k)."""
        cfg, k = self.config, self.config.level_window
        if self.quiet > 0:
            self.quiet -= 1
            return None
        if not k or len(self.window) < 2 * k:
            return None
        losses = list(self.window)
        before, recent = float(np.median(losses[-2 * k : -k])), float(np.median(losses[-k:]))
        error = 1.2533 * (1.4826 * mad / math.sqrt(2)) * math.sqrt(2 / k)
        scale = max(error, cfg.rel_floor * abs(before)) + cfg.eps
        z = (recent - before) / scale
        if z <= cfg.level_threshold:
            return None
        self.quiet = 2 * k
        return _claim(
            self.name, step, loss, non_finite=0, level_shift=1, level_before=before,
            level_recent=recent, scale=scale, z=z, threshold=cfg.level_threshold,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The window, the current run of exceedances and the level check's quiet steps."""
        return {
            "detector": self.name,
            "window": list(self.window),
            "count": self.count,
            "quiet": self.quiet,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict` (one saved before the level check: no quiet steps)."""
        _same_detector(self.name, state)
        self.window = deque((float(x) for x in state["window"]), maxlen=self.config.window)
        self.count = int(state["count"])
        self.quiet = int(state.get("quiet", 0))

    def reset(self) -> None:
        """Forget all history."""
        self.window.clear()
        self.count = self.quiet = 0


# -- early max ----------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class EarlyMaxConfig:
    """Megatron-LM's spiky-loss rule."""

    early_steps: int = 10
    """Observed steps whose largest loss is the reference (it never fires during them)."""
    factor: float = 10.0
    """Fire when the loss exceeds this times the reference."""

    def __post_init__(self) -> None:
        _check(self.early_steps >= 1, "early_max.early_steps", ">= 1", self.early_steps)
        _check(self.factor > 1, "early_max.factor", "> 1", self.factor)


class EarlyMaxDetector:
    """Fires when |loss| exceeds ``factor`` times the largest |loss| of the first steps."""

    name: str = "early_max"

    def __init__(self, config: EarlyMaxConfig | None = None) -> None:
        self.config = config or EarlyMaxConfig()
        self.seen, self.early_max = 0, 0.0

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Record the early maximum, then compare each loss with ``factor`` times it."""
        if not math.isfinite(loss):
            return _claim(self.name, step, loss, non_finite=1)
        if self.seen < self.config.early_steps:
            self.seen += 1
            self.early_max = max(self.early_max, abs(loss))
            return None
        threshold = self.config.factor * self.early_max
        if abs(loss) <= threshold:
            return None
        return _claim(
            self.name, step, loss, non_finite=0, early_max=self.early_max,
            factor=self.config.factor, threshold=threshold,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The early maximum and how many early steps it covers."""
        return {"detector": self.name, "seen": self.seen, "early_max": self.early_max}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`."""
        _same_detector(self.name, state)
        self.seen, self.early_max = int(state["seen"]), float(state["early_max"])

    def reset(self) -> None:
        """Forget all history."""
        self.seen, self.early_max = 0, 0.0


# -- configuration and monitor -----------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class SpikeConfig:
    """Which loss-spike detectors run, which of them trigger recovery, and their settings."""

    robust: RobustZScoreConfig = field(default_factory=RobustZScoreConfig)
    early_max: EarlyMaxConfig = field(default_factory=EarlyMaxConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    enabled: tuple[str, ...] = NAMES
    """Detectors that run and journal their claims."""
    acting: tuple[str, ...] = ("robust_zscore", "early_max")
    """Detectors whose claims trigger recovery (a subset of ``enabled``)."""
    acting_sides: tuple[Side, ...] = ("above",)
    """Sides of a two-sided band (the forecaster's) whose claims trigger recovery, when its
    detector acts; a claim on another side is journaled only. A loss below the expected
    range is not a failure a rollback mends (see docs/detectors.md)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the detector names (called again by `SpikeMonitor`: fields may be reassigned)."""
        for key in ("enabled", "acting"):
            for name in getattr(self, key):
                if name not in NAMES:
                    raise ValueError(
                        f"{_PREFIX}.{key} has unknown detector {name!r}; "
                        f"expected some of {', '.join(NAMES)}"
                    )
        for side in self.acting_sides:
            if side not in SIDES:
                raise ValueError(
                    f"{_PREFIX}.acting_sides has unknown side {side!r}; "
                    f"expected some of {', '.join(SIDES)}"
                )
        extra = [name for name in self.acting if name not in self.enabled]
        if extra:
            raise ValueError(
                f"{_PREFIX}.acting must be a subset of {_PREFIX}.enabled; "
                f"{', '.join(extra)} acting but not enabled"
            )


def build_detectors(config: SpikeConfig) -> list[LossSpikeDetector]:
    """The enabled detectors, in the order ``config.enabled`` names them."""
    config.validate()
    makers: dict[str, Callable[[], LossSpikeDetector]] = {
        "robust_zscore": lambda: RobustZScoreDetector(config.robust),
        "early_max": lambda: EarlyMaxDetector(config.early_max),
        "forecast": lambda: ForecastDetector(config.forecast),
    }
    return [makers[name]() for name in dict.fromkeys(config.enabled)]


class SpikeMonitor:
    """Runs the enabled detectors on every step and tells whether an acting one fired."""

    def __init__(self, config: SpikeConfig | None = None) -> None:
        self.config = config or SpikeConfig()
        self.detectors = build_detectors(self.config)

    def observe(self, step: int, loss: float) -> list[SpikeClaim]:
        """Every claim made at this step (empty when none fired)."""
        claims = [detector.observe(step, loss) for detector in self.detectors]
        return [claim for claim in claims if claim is not None]

    def acting(self, claims: list[SpikeClaim]) -> bool:
        """Whether any claim comes from a detector that triggers recovery, on a side that
        does (a claim without a side acts when its detector does)."""
        return any(self._acts(claim) for claim in claims)

    def _acts(self, claim: SpikeClaim) -> bool:
        if claim.detector not in self.config.acting:
            return False
        return claim.side is None or claim.side in self.config.acting_sides

    def state_dict(self) -> dict[str, Any]:
        """Each enabled detector's state, by name."""
        return {detector.name: detector.state_dict() for detector in self.detectors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore each enabled detector; one without saved state starts afresh."""
        for detector in self.detectors:
            if detector.name in state:
                detector.load_state_dict(state[detector.name])
            else:
                detector.reset()

    def reset(self) -> None:
        """Forget every detector's history."""
        for detector in self.detectors:
            detector.reset()
