"""The gradient heatmap of `tightrope watch`: layers down, recent steps across, each cell a
layer's gradient norm against that layer's own median, so a layer that heats up, a gradient
that vanishes or a non-finite one shows where and when, as the microscope writes.

Cells come from the microscope's records (every few steps, and every step around an anomaly),
else from the journal's ``layer_stats`` events. A cell's glyph and colour say its band, so
the map reads without colour too: ``▁`` under half the median, ``▃`` up to 2x, ``▆`` up to
the hot ratio (3x, as the hottest-layers table), ``█`` at or above it, ``!`` non-finite,
``·`` not measured (the record did not cover the layer).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.live.hot_layers import HOT_RATIO
from harness.records.microscope_file import Microscope

#: Columns shown: the most recent records.
WIDTH = 40
#: (upper bound of the ratio, glyph, style), low to high.
BANDS: tuple[tuple[float, str, str], ...] = (
    (0.5, "▁", "blue"),
    (2.0, "▃", "green"),
    (HOT_RATIO, "▆", "yellow"),
    (math.inf, "█", "bold red"),
)
NON_FINITE = ("!", "bold white on red")
UNMEASURED = ("·", "dim")


@dataclass(frozen=True, slots=True)
class Heatmap:
    """One rank's recent gradient norms over each layer's median."""

    source: str  # "microscope" or "layer_stats"
    rank: int
    layers: list[str]
    steps: list[int]  # of the columns; empty where the source has none (layer_stats)
    ratios: np.ndarray  # [layer, column]: NaN not measured, +inf non-finite

    def cell(self, layer: int, column: int) -> tuple[str, str]:
        """The glyph and style of one cell."""
        ratio = float(self.ratios[layer, column])
        if math.isnan(ratio):
            return UNMEASURED
        if math.isinf(ratio):
            return NON_FINITE
        return next((glyph, style) for top, glyph, style in BANDS if ratio < top)


def _ratios(grads: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """``grads`` [step, layer] over each layer's median of its finite values, as [layer,
    step]; +inf where measured and not finite, NaN where not measured."""
    out = np.full(grads.shape, np.nan)
    for i in range(grads.shape[1]):
        column = grads[:, i]
        finite = column[np.isfinite(column)]
        median = float(np.median(finite)) if len(finite) else math.nan
        ok = np.isfinite(column)
        if median > 0:
            out[ok, i] = column[ok] / median
        elif len(finite):
            out[ok, i] = 1.0  # a layer whose gradients are all zero: nothing above it
        out[measured[:, i] & ~ok, i] = math.inf
    return out.T


def from_microscope(scope: Microscope, rank: int, width: int = WIDTH) -> Heatmap | None:
    """The last ``width`` records of ``rank`` (None when it has none)."""
    series = scope.ranks.get(rank)
    if series is None or not len(series):
        return None
    grads = series.grad_norm.astype(np.float64)
    # NaN is "not measured" unless the record measured the layer's weights: then the
    # gradient itself was NaN (as the hottest-layers table reads it).
    measured = ~np.isnan(grads) | np.isfinite(series.weight_norm)
    ratios = _ratios(grads, measured)[:, -width:]
    steps = [int(s) for s in series.steps[-width:]]
    return Heatmap("microscope", rank, list(scope.layers), steps, ratios)


def from_layer_stats(
    history: Mapping[tuple[int, str], Sequence[float]], rank: int, width: int = WIDTH
) -> Heatmap | None:
    """The same from the journal's ``layer_stats`` grad norms (NaN where it wrote null:
    not finite), right-aligned on the latest step."""
    mine = {name: list(v) for (r, name), v in history.items() if r == rank and v}
    if not mine:
        return None
    length = max(len(v) for v in mine.values())
    grads = np.full((length, len(mine)), np.nan)
    for i, values in enumerate(mine.values()):
        grads[length - len(values) :, i] = values
    measured = np.zeros_like(grads, dtype=bool)
    for i, values in enumerate(mine.values()):
        measured[length - len(values) :, i] = True
    ratios = _ratios(grads, measured)[:, -width:]
    return Heatmap("layer_stats", rank, list(mine), [], ratios)


def render(heatmap: Heatmap | None) -> RenderableType:
    """The map with its title, step span and legend."""
    if heatmap is None:
        return Text("gradient heatmap: no per-layer records", style="dim")
    span = f", steps {heatmap.steps[0]}-{heatmap.steps[-1]}" if heatmap.steps else ""
    title = (
        f"gradient heatmap (from the {heatmap.source}, rank {heatmap.rank}{span}): "
        "grad norm over the layer's median"
    )
    table = Table(box=None, show_header=False)
    table.add_column("layer")
    table.add_column("cells", no_wrap=True)
    for i, name in enumerate(heatmap.layers):
        cells = Text()
        for column in range(heatmap.ratios.shape[1]):
            glyph, style = heatmap.cell(i, column)
            cells.append(glyph, style)
        table.add_row(name, cells)
    legend = Text("  ", style="dim")
    for (top, glyph, style), low in zip(BANDS, (0.0, *(b[0] for b in BANDS)), strict=False):
        words = f">= {low:g}x" if math.isinf(top) else f"< {top:g}x"
        legend.append(glyph, style)
        legend.append(f" {words}  ", "dim")
    legend.append(NON_FINITE[0], NON_FINITE[1])
    legend.append(" non-finite  ", "dim")
    legend.append(UNMEASURED[0], UNMEASURED[1])
    legend.append(" not measured", "dim")
    return Group(Text(title, style="italic"), table, legend)
