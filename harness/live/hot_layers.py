"""The hottest layers of a run: those whose latest gradient norm is furthest above their own
median, non-finite ones first (what `tightrope watch` lists)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from harness.records.microscope_file import Microscope

#: A layer at least this many times its own median gradient norm is shown as hot.
HOT_RATIO = 3.0
#: How many layers the view lists.
TOP = 3


@dataclass(frozen=True, slots=True)
class HotLayer:
    """One layer's latest gradient norm against its own median."""

    layer: str
    rank: int
    step: int
    latest: float  # non-finite when the gradient was
    median: float  # NaN when the layer has no finite history
    source: str  # "microscope" or "layer_stats"

    @property
    def finite(self) -> bool:
        """False for an overflowed or NaN gradient."""
        return math.isfinite(self.latest)

    @property
    def ratio(self) -> float:
        """Latest over median (infinite for a non-finite gradient, NaN with no median)."""
        if not self.finite:
            return math.inf
        if not math.isfinite(self.median) or self.median <= 0:
            return math.nan
        return self.latest / self.median

    @property
    def hot(self) -> bool:
        """Non-finite, or at least `HOT_RATIO` times its median."""
        return not self.finite or self.ratio >= HOT_RATIO


def _order(layer: HotLayer) -> tuple[int, float]:
    ratio = layer.ratio
    return (0 if not layer.finite else 1, -(ratio if math.isfinite(ratio) else -math.inf))


def hottest(candidates: Iterable[HotLayer], top: int = TOP) -> list[HotLayer]:
    """The ``top`` layers furthest above their median, one row per layer (its worst rank)."""
    worst: dict[str, HotLayer] = {}
    for layer in candidates:
        kept = worst.get(layer.layer)
        if kept is None or _order(layer) < _order(kept):
            worst[layer.layer] = layer
    return sorted(worst.values(), key=_order)[:top]


def from_microscope(scope: Microscope, rank: int | None = None) -> list[HotLayer]:
    """Each layer's latest recorded gradient norm against its median, per rank."""
    out: list[HotLayer] = []
    for r, series in scope.ranks.items():
        if (rank is not None and r != rank) or not len(series):
            continue
        for i, name in enumerate(scope.layers):
            grad, weight = series.grad_norm[:, i], series.weight_norm[:, i]
            # NaN is "not measured", unless the record measured the layer's weights: then
            # the gradient itself was NaN, which is the most important finding of all.
            measured = ~np.isnan(grad) | np.isfinite(weight)
            rows = np.flatnonzero(measured)
            if not len(rows):
                continue
            last = int(rows[-1])
            finite = grad[np.isfinite(grad)]
            median = float(np.median(finite)) if len(finite) else math.nan
            out.append(
                HotLayer(name, r, int(series.steps[last]), float(grad[last]), median, "microscope")
            )
    return out


def from_layer_stats(
    history: Mapping[tuple[int, str], Sequence[float]],
    steps: Mapping[int, int],
    rank: int | None = None,
) -> list[HotLayer]:
    """The same from the journal's `layer_stats` grad norms (NaN where it wrote null)."""
    out: list[HotLayer] = []
    for (r, name), values in history.items():
        if (rank is not None and r != rank) or not values:
            continue
        finite = [v for v in values if math.isfinite(v)]
        median = float(np.median(finite)) if finite else math.nan
        out.append(HotLayer(name, r, steps.get(r, 0), values[-1], median, "layer_stats"))
    return out
