"""The microscope's plots for the HTML scorecard, as inline SVG (see microscope_figures.py).

Heatmaps are drawn with ``interpolation="none"``: the SVG then holds one small PNG with
one pixel per cell, scaled by the browser, not a resampled picture (and not thousands of
rectangles). As in plots.py, matplotlib is driven through `Figure` alone, never pyplot.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.records.microscope_file import WHY_AFTER, WHY_ANOMALY, WHY_BEFORE, RankSeries
from harness.scorecard.microscope_figures import Grid, Marks
from harness.scorecard.render.plots import Plot, inline_svg, margins_in_inches, text_inches

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Colour of non-finite cells and bins: outside every colour map used here.
NONFINITE = "#ff00cc"
FAULT = "#d62728"
RECOVERY = "#2ca02c"
DIAGNOSED = "#ff7f0e"
OVERFLOW = "#d9480f"
HEATMAP_CMAP = "viridis"
#: Most ridgeline panels (layers) in one plot.
MAX_PANELS = 12

# Where the ridgelines put each histogram bin on their x axis (log10 |activation|): the
# 32 half-decade bins at their centres, then the three special bins set apart.
_LOG_X = -7.75 + 0.5 * np.arange(32)
_ZERO_X, _OVER_X, _NAN_X = -9.75, 9.5, 11.0
_BIN_LABELS = ["0", "1e-6", "1e-3", "1", "1e3", "1e6", "≥1e8", "nan"]
_WHY_COLOUR = (
    (WHY_ANOMALY, "#d62728", "anomaly step"),
    (WHY_BEFORE, "#5b7fa6", "before the anomaly"),
    (WHY_AFTER, "#e69f00", "after the anomaly"),
)
PERIODIC = "#1f6fb4"
#: A heatmap's colorbar, its tick labels and its label: inches at the right of its axes.
COLORBAR_INCHES = 1.0


def _render(
    plot_id: str,
    title: str,
    size: tuple[float, float],
    draw: Callable[[Figure], None],
    *,
    fixed: bool = False,
) -> Plot:
    """A figure of ``size`` inches filled by ``draw``, as inline SVG; laid out by
    matplotlib's constrained layout, or, ``fixed``, by the margins ``draw`` sets."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": plot_id, "font.size": 8}):
        fig = Figure(figsize=size, layout=None if fixed else "constrained")
        draw(fig)
        fig.suptitle(title, x=0.01, ha="left", fontsize=10)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return Plot(plot_id, title, inline_svg(_round_paths(buf.getvalue()), plot_id))


_PATH_DATA = re.compile(r'(?<= d=")[^"]*')
_LONG_NUMBER = re.compile(r"(-?\d+\.\d)\d+")


def _round_paths(svg: str) -> str:
    """Path coordinates to 0.1 pt (matplotlib writes six decimals): a third of the bytes,
    nothing a reader can see."""
    return _PATH_DATA.sub(lambda m: _LONG_NUMBER.sub(r"\1", m.group(0)), svg)


def _column_labels(g: Grid) -> tuple[list[int], list[str]]:
    n = len(g.first)
    every = max(1, math.ceil(n / 12))
    ticks = list(range(0, n, every))
    labels = [
        str(g.first[i]) if g.first[i] == g.last[i] else f"{g.first[i]}-{g.last[i]}" for i in ticks
    ]
    return ticks, labels


def heatmap(
    plot_id: str,
    title: str,
    label: str,
    g: Grid,
    layers: Sequence[str],
    marks: Marks,
    outlined: Sequence[int] = (),
) -> Plot:
    """Layers (rows, forward order) x recorded steps, log colour; marks and outlines."""
    from matplotlib.colors import ListedColormap, LogNorm
    from matplotlib.patches import Patch, Rectangle

    n_layers, n_cols = g.values.shape
    finite = g.values[np.isfinite(g.values) & (g.values > 0)]
    height = min(9.0, max(2.6, 0.16 * n_layers + 1.6))

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        shown = np.ma.masked_invalid(g.values)
        handles: list[Any] = []
        if finite.size:
            lo, hi = float(finite.min()), float(finite.max())
            norm = LogNorm(vmin=lo, vmax=hi if hi > lo else lo * 10)
            image = ax.imshow(
                shown, aspect="auto", cmap=HEATMAP_CMAP, norm=norm, interpolation="none"
            )
        bad = np.isinf(g.values)
        if bad.any():
            ax.imshow(
                np.ma.masked_where(~bad, np.ones_like(g.values)),
                aspect="auto",
                cmap=ListedColormap([NONFINITE]),
                interpolation="none",
                vmin=0,
                vmax=1,
            )
            handles.append(Patch(color=NONFINITE, label="non-finite"))
        ax.set_xlim(-0.5, n_cols - 0.5)
        ax.set_ylim(n_layers - 0.5, -0.5)
        for row in outlined:
            ax.add_patch(
                Rectangle(
                    (-0.5, row - 0.5), n_cols, 1, fill=False, edgecolor=DIAGNOSED, lw=2.2, zorder=5
                )
            )
        if outlined:
            handles.append(
                Patch(fill=False, edgecolor=DIAGNOSED, lw=2, label="trainer's diagnosis")
            )
        fault_x = sorted({g.x_of(step) for step, _rank in marks.faults})
        recovery_x = sorted({g.x_of(step) for step in marks.recoveries})
        if fault_x:
            # Wide and translucent, below the recovery dashes: a fault recovered from at its
            # own step still shows both.
            ax.vlines(fault_x, -0.5, n_layers - 0.5, colors=FAULT, lw=3.5, alpha=0.6)
            handles.append(_line(FAULT, "-", "fault injected", lw=3.5, alpha=0.6))
        if recovery_x:
            ax.vlines(recovery_x, -0.5, n_layers - 0.5, colors=RECOVERY, lw=1.2, linestyles="--")
            handles.append(_line(RECOVERY, "--", "recovered / restart / resume"))
        ticks, labels = _column_labels(g)
        turned = len(labels) > 6
        ax.set_xticks(ticks, labels, rotation=45 if turned else 0, fontsize=7)
        every = max(1, math.ceil(n_layers / 40))
        rows = [layers[i] for i in range(0, n_layers, every)]
        ax.set_yticks(range(0, n_layers, every), rows)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_xlabel("recorded step" + (f" (groups of {g.group}, max)" if g.group > 1 else ""))
        room = _heatmap_margins(fig, rows, labels if turned else [], math.ceil(len(handles) / 4))
        if finite.size:  # after the margins: the colorbar takes its inches from the axes'
            fraction = COLORBAR_INCHES / room
            fig.colorbar(image, ax=ax, label=f"{label} (log scale)", fraction=fraction, pad=0.01)
        if handles:
            fig.legend(handles=handles, loc="lower center", ncols=4, frameon=False)

    return _render(plot_id, title, (9.0, height), draw, fixed=True)


def _heatmap_margins(fig: Figure, rows: Sequence[str], turned: Sequence[str], legend: int) -> float:
    """Fixed margins around a heatmap: its row labels on the left, its column labels
    (``turned``: those set at 45 degrees) and ``legend`` rows of legend below; returns the
    axes' width in inches, the colorbar's included. Matplotlib's constrained layout measured
    every tick label twice more than drawing does: 45% of the HTML scorecard's rendering."""
    width = fig.get_size_inches()[0]
    left = text_inches(rows, 7) + 0.2
    below = 0.45 + (text_inches(turned, 7) * 0.71 if turned else 0.0) + 0.2 * legend
    margins_in_inches(fig, left=left, right=0.1, top=0.38, bottom=below)
    return float(width - left - 0.1)


def _line(colour: str, style: str, label: str, lw: float = 1.4, alpha: float = 1.0) -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], color=colour, ls=style, lw=lw, alpha=alpha, label=label)


def _why_colour(why: int) -> str:
    for flag, colour, _label in _WHY_COLOUR:
        if why & flag:
            return colour
    return PERIODIC


def ridge_panels(series: RankSeries, records: Sequence[int], keep: Sequence[int]) -> list[int]:
    """The layers to draw (forward order): ``keep`` first, then the most overflowed."""
    n_layers = series.act_hist.shape[1]
    if n_layers <= MAX_PANELS:
        return list(range(n_layers))
    hist = series.act_hist[list(records)].sum(axis=0)  # [L, B]
    top = np.array([np.nonzero(h[1:-2])[0].max(initial=-1) for h in hist])
    score = hist[:, -1] * 1e6 + hist[:, -2] * 1e3 + top
    chosen = [k for k in keep if k < n_layers][:MAX_PANELS]
    for k in np.argsort(-score, kind="stable").tolist():
        if len(chosen) >= MAX_PANELS:
            break
        if k not in chosen:
            chosen.append(int(k))
    return sorted(chosen)


def ridgelines(
    plot_id: str,
    series: RankSeries,
    layers: Sequence[str],
    records: Sequence[int],
    panels: Sequence[int],
) -> Plot:
    """One ridgeline per layer: a normalised |activation| histogram per recorded step."""
    from matplotlib.patches import Patch

    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    height = nrows * (0.85 + 0.2 * len(records)) + 0.9
    whys = [int(series.why[i]) for i in records]

    def draw(fig: Figure) -> None:
        panel = _grid_margins(fig, nrows, ncols, [str(series.steps[i]) for i in records])
        axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
        for n, ax in enumerate(axes.flat):
            if n >= len(panels):
                ax.set_visible(False)
                continue
            _ridge(ax, series, panels[n], records)
            ax.set_title(_shortened(layers[panels[n]], panel, 8), fontsize=8, loc="left")
            if n % ncols == 0:
                ax.set_yticks(
                    [len(records) - 1 - j for j in range(len(records))],
                    [str(series.steps[i]) for i in records],
                    fontsize=6.5,
                )
        for ax in axes.flat:
            ax.tick_params(axis="x", labelbottom=True)  # every panel: rows above gaps too
            ax.set_xticks(
                [_ZERO_X, -6, -3, 0, 3, 6, _OVER_X, _NAN_X], _BIN_LABELS, fontsize=6.5, rotation=90
            )
        fig.supylabel("step", fontsize=8)
        # Fill only: a stroke of these colours is left to the bins that hold counts.
        handles = [
            Patch(facecolor=c, edgecolor="none", label=lbl)
            for f, c, lbl in _WHY_COLOUR
            if any(w & f for w in whys)
        ]
        if any(not w & (WHY_ANOMALY | WHY_BEFORE | WHY_AFTER) for w in whys):
            handles.append(Patch(facecolor=PERIODIC, edgecolor="none", label="periodic record"))
        handles += [
            Patch(facecolor=OVERFLOW, edgecolor="none", label="≥1e8 (overflow)"),
            Patch(facecolor=NONFINITE, edgecolor="none", label="nan/inf"),
        ]
        fig.legend(handles=handles, loc="lower center", ncols=6, frameon=False)

    title = "Activation histograms: |activation| in log10 bins; zero, overflow, nan/inf apart"
    return _render(plot_id, title, (9.0, height), draw, fixed=True)


def _grid_margins(fig: Figure, nrows: int, ncols: int, steps: Sequence[str]) -> float:
    """Fixed margins and gaps (inches) for the ridgelines' panels: the step labels and the
    figure's y label on the left; above each row its panels' titles (the figure's title
    above the first), below it their bin labels, turned (and the legend's row below the
    last). As for heatmaps, in place of the constrained layout's three measures of each.
    Returns a panel's width in inches."""
    width, height = fig.get_size_inches()
    left = 0.3 + text_inches(steps, 6.5) + 0.1
    under = text_inches(_BIN_LABELS, 6.5) + 0.12
    title, top, bottom, between = 0.2, 0.3, 0.3, 0.12
    panel_height = (height - top - bottom - nrows * (title + under)) / nrows
    panel_width = (width - left - 0.1 - (ncols - 1) * between) / ncols
    margins_in_inches(
        fig,
        left=left,
        right=0.1,
        top=top + title,
        bottom=bottom + under,
        hspace=(title + under) / panel_height,
        wspace=between / panel_width,
    )
    return float(panel_width)


def _shortened(name: str, inches: float, points: float) -> str:
    """``name``, its middle cut out (``…``) until it fits ``inches`` at ``points``: a panel's
    title never runs into the next panel's."""
    keep = len(name)
    shown = name
    while keep > 8 and text_inches([shown], points) > inches:
        keep -= 2
        shown = f"{name[: keep // 2]}…{name[len(name) - keep // 2 :]}"
    return shown


def _ridge(ax: Any, series: RankSeries, layer: int, records: Sequence[int]) -> None:
    from matplotlib.colors import to_rgba

    counts = series.act_hist[list(records), layer].astype(np.float64)  # [k, B]
    totals = counts.sum(axis=1, keepdims=True)
    frac = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    scale = 1.6 / max(float(frac.max()), 1e-12)
    k = len(records)
    for j, i in enumerate(records):
        y0 = k - 1 - j
        colour = _why_colour(int(series.why[i]))
        h = frac[j] * scale
        z = 2 * j  # lower ridges are drawn in front
        # One closed path per curve, its edge the outline, no base-line vertices: a third of
        # the SVG of a fill between plus a line.
        xs = np.concatenate([_LOG_X[:1], _LOG_X, _LOG_X[-1:]])
        ys = np.concatenate([[y0], y0 + h[1:33], [y0]])
        ax.fill(xs, ys, facecolor=to_rgba(colour, 0.45), edgecolor=colour, lw=0.8, zorder=z)
        for x, b, c in ((_ZERO_X, 0, "#7a7a7a"), (_OVER_X, 33, OVERFLOW), (_NAN_X, 34, NONFINITE)):
            if counts[j, b] > 0:
                # Any count at all is shown: one overflowed value in a million is the finding.
                top = y0 + max(h[b], 0.6)
                ax.vlines(x, y0, top, colors=c, lw=2.2, zorder=z + 1)
                ax.plot([x], [top], marker="o", ms=2.8, color=c, zorder=z + 1)
    for x in (-8.9, 8.75):
        ax.axvline(x, color="#bbbbbb", lw=0.6, ls=":")
    ax.set_xlim(-10.6, 11.8)
    ax.set_ylim(-0.2, k + 0.9)
    ax.tick_params(axis="y", length=0)


def latency_map(plot_id: str, ranks: Sequence[int], matrix: np.ndarray) -> Plot:
    """Rank x rank median point-to-point round trip, each cell annotated in µs."""
    n = len(ranks)
    finite = matrix[np.isfinite(matrix)]

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        if finite.size:
            image = ax.imshow(
                np.ma.masked_invalid(matrix),
                cmap="cividis",
                interpolation="none",
                vmin=float(finite.min()),
                vmax=float(finite.max())
                if finite.max() > finite.min()
                else float(finite.min()) + 1,
            )
            fig.colorbar(image, ax=ax, label="median round trip (µs)", pad=0.01)
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_ylim(n - 0.5, -0.5)
        if n <= 16:
            mid = float(np.median(finite)) if finite.size else 0.0
            for i in range(n):
                for j in range(n):
                    value = matrix[i, j]
                    text = "–" if not np.isfinite(value) else _us(value)
                    colour = "white" if np.isfinite(value) and value < mid else "black"
                    ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
        ax.set_xticks(range(n), [str(r) for r in ranks])
        ax.set_yticks(range(n), [str(r) for r in ranks])
        ax.set_xlabel("to rank")
        ax.set_ylabel("from rank")

    side = min(7.0, 2.6 + 0.35 * n)
    return _render(plot_id, "Point-to-point latency", (side + 1.0, side), draw)


def _us(value: float) -> str:
    """A µs figure with three significant digits at most (12.3, 456, 7890)."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"
