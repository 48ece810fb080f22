"""Each layer against its own history: the swing detector and the stalled-layer detector.

`LayerHistory` keeps, per layer and signal, the recent finite values of steps that went
well; its median is the layer's norm. Two detectors read one step's `StepStats` against it:

- **swing** (``layer_swing``): a layer's gradient norm ``swing_factor`` (1000) times above
  or below its median. Upward, the step's update is skipped on every rank: one layer's
  gradient three orders of magnitude above its norm is a corrupted gradient, and clipping
  would only shrink every other layer's share of the step to let it through. The same
  factor on a layer's weight norm (either way, or not finite: its weights changed outside
  the optimizer) and on its largest activation (upward) is journaled too; a weight swing
  is a failure for the recovery policy (roll back to weights that were not corrupted).
- **stall** (``stalled_layer``): a layer whose parameters stopped updating while the rest
  train, seen in one of two ways for ``window`` (3) steps in a row: its share of non-zero
  gradient elements fell under ``nonzero_floor`` (50%) of its median (fp16 flushed its
  gradients to zero: underflow), or its update ratio relative to the other layers' fell
  under ``update_floor`` (1%) of its median (its gradients are too small to move it).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from reference_trainer.errors import ConfigError
from reference_trainer.stability.layer_stats import SIGNALS, StepStats


@dataclass(kw_only=True, slots=True)
class StallConfig:
    """The stalled-layer (gradient underflow) guard."""

    enabled: bool = True
    window: int = 3
    """Steps in a row a layer must look stalled."""
    nonzero_floor: float = 0.5
    """Non-zero gradient share under this fraction of the layer's median: flushed."""
    update_floor: float = 0.01
    """Relative update ratio under this fraction of the layer's median: not moving."""
    max_scale: float = 2.0**24
    """fp16: the loss scale is raised (x growth factor per stalled step) up to this."""

    def __post_init__(self) -> None:
        p = "stability.underflow."
        if self.window < 1:
            raise ConfigError(f"{p}window must be >= 1, got {self.window}")
        for name in ("nonzero_floor", "update_floor"):
            if not 0 < getattr(self, name) < 1:
                raise ConfigError(f"{p}{name} must be in (0, 1), got {getattr(self, name)}")
        if not self.max_scale >= 1:
            raise ConfigError(f"{p}max_scale must be >= 1, got {self.max_scale}")


class LayerHistory:
    """Recent finite values of each layer's signals, from steps that went well."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.values: dict[tuple[str, str], deque[float]] = {}

    def add(self, stats: StepStats) -> None:
        """Remember a good step's figures (non-finite ones are never remembered)."""
        for layer, signals in stats.layers.items():
            relative = self.relative_update(stats, layer)
            extra = {} if relative is None else {"relative_update": relative}
            for signal, value in (signals | extra).items():
                if math.isfinite(value):
                    key = (layer, signal)
                    self.values.setdefault(key, deque(maxlen=self.length)).append(value)

    def median(self, layer: str, signal: str, min_count: int = 1) -> float | None:
        """The layer's norm for a signal, or None with fewer than ``min_count`` values."""
        seen = self.values.get((layer, signal))
        if not seen or len(seen) < min_count:
            return None
        return statistics.median(seen)

    def relative_update(self, stats: StepStats, layer: str) -> float | None:
        """The layer's update ratio over the median of the other layers' this step."""
        others = [
            v["update_ratio"]
            for name, v in stats.layers.items()
            if name != layer and "update_ratio" in v
        ]
        mine = stats.value(layer, "update_ratio")
        if mine is None or not others:
            return None
        middle = statistics.median(others)
        return mine / middle if middle > 0 else None

    def state_dict(self) -> dict[str, Any]:
        """The remembered values, for checkpoints."""
        return {"values": [[layer, signal, list(v)] for (layer, signal), v in self.values.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""
        self.values = {
            (str(layer), str(signal)): deque((float(x) for x in v), maxlen=self.length)
            for layer, signal, v in state["values"]
            if signal in SIGNALS or signal == "relative_update"
        }


@dataclass(frozen=True, slots=True)
class Swing:
    """A layer's signal far from its own norm."""

    layer: str
    signal: str  # grad_norm, weight_norm or act_max
    direction: str  # "up" or "down"
    value: float
    median: float

    @property
    def details(self) -> dict[str, Any]:
        """The figures, for the claim."""
        finite = math.isfinite(self.value)
        return {
            "layer": self.layer,
            "signal": self.signal,
            "direction": self.direction,
            "value": self.value if finite else str(self.value),
            "median": self.median,
            "ratio": self.value / self.median if finite else "inf",
        }


def swings(
    values: dict[str, float],
    signal: str,
    history: LayerHistory,
    factor: float,
    min_history: int,
    *,
    directions: tuple[str, ...] = ("up", "down"),
    non_finite: bool = False,
) -> list[Swing]:
    """Layers whose ``signal`` is ``factor`` times above or below their median (a
    non-finite value counts as up only with ``non_finite``)."""
    found = []
    for layer, value in values.items():
        median = history.median(layer, signal, min_history)
        if median is None or median <= 0:
            continue
        if not math.isfinite(value):
            if non_finite and "up" in directions:
                found.append(Swing(layer, signal, "up", value, median))
            continue
        if value >= factor * median and "up" in directions:
            found.append(Swing(layer, signal, "up", value, median))
        elif value * factor <= median and "down" in directions:
            found.append(Swing(layer, signal, "down", value, median))
    return found


@dataclass(slots=True)
class StallWatch:
    """Counts, per layer, the steps in a row it looked stalled; says when one is."""

    config: StallConfig
    min_history: int
    streak: dict[str, int] = field(default_factory=dict)

    def observe(
        self, stats: StepStats, previous: StepStats | None, history: LayerHistory
    ) -> list[dict[str, Any]]:
        """The layers stalled for ``window`` steps as of this step (each reported once per
        stall, when it reaches the window), with the figures. ``stats`` holds this step's
        gradients; update ratios are the previous step's (the update comes later)."""
        cfg, found = self.config, []
        looks: dict[str, dict[str, Any]] = {}
        for layer in stats.layers:
            evidence = self._evidence(stats, previous, history, layer)
            if evidence is not None:
                looks[layer] = evidence
        if len(looks) == len(stats.layers):  # nothing trains: not one layer's stall
            looks = {}
        for layer in stats.layers:
            if layer not in looks:
                self.streak.pop(layer, None)
                continue
            self.streak[layer] = self.streak.get(layer, 0) + 1
            if self.streak[layer] == cfg.window:
                found.append({"layer": layer, "steps": cfg.window} | looks[layer])
        return found

    def stalled(self) -> list[str]:
        """Layers stalled right now (at or past the window)."""
        return [name for name, n in self.streak.items() if n >= self.config.window]

    def _evidence(
        self, stats: StepStats, previous: StepStats | None, history: LayerHistory, layer: str
    ) -> dict[str, Any] | None:
        cfg = self.config
        nonzero = stats.value(layer, "nonzero")
        usual = history.median(layer, "nonzero", self.min_history)
        if nonzero is not None and usual and nonzero < cfg.nonzero_floor * usual:
            return {"signal": "nonzero", "nonzero": nonzero, "median_nonzero": usual}
        if previous is None:
            return None
        relative = history.relative_update(previous, layer)
        usual = history.median(layer, "relative_update", self.min_history)
        if relative is not None and usual and relative < cfg.update_floor * usual:
            return {"signal": "update_ratio", "relative_update": relative, "median": usual}
        return None
