"""Plots of a scenario's journals for the HTML scorecard, as inline SVG.

Three plots, faulted run (colour) against its fault-free baseline (grey): loss, loss scale
(when any step had one) and gradient norm, against the step. Steps are drawn in the
order the journal wrote them, so a rollback shows as a dotted jump back to the restored
step, not as a rewritten history. Vertical lines mark where faults were injected (red),
detected (orange) and recovered from (green).

Matplotlib is driven through `matplotlib.figure.Figure` alone, never pyplot: nothing
global (backend, figure registry) changes in the caller's process, and no display is
needed, which is what selecting the Agg backend would otherwise be for.
"""

from __future__ import annotations

import bisect
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from harness.scorecard.step_series import StepSeries, Value

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


FAULTED = "#1f6fb4"
BASELINE = "#a0a0a0"
# Beyond this many points a line is thinned to each bucket's extremes: a page of 10k-step
# runs stays small, and the spikes that matter survive.
MAX_POINTS = 1500
# Room (inches) around the axes for the title, the x axis' labels, each row of the legend
# below, and the y axis' label and ticks besides the widest of its tick labels (measured):
# set, where matplotlib's constrained layout measured every tick label twice more than
# drawing does (about 45% of an HTML scorecard's rendering).
MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM, LEGEND_ROW, MARGIN_LEFT = 0.2, 0.32, 0.5, 0.19, 0.45


@dataclass(frozen=True, slots=True)
class Plot:
    """One rendered plot: a stable id, its title and the inline SVG text."""

    id: str
    title: str
    svg: str


def _segments(steps: list[int], values: list[Value]) -> list[tuple[list[int], list[float]]]:
    """Runs of increasing steps; a new run starts where a restart went back."""
    out: list[tuple[list[int], list[float]]] = []
    for step, value in zip(steps, values, strict=True):
        if not out or step <= out[-1][0][-1]:
            out.append(([], []))
        out[-1][0].append(step)
        # NaN is matplotlib's gap, for values missing and non-finite alike.
        out[-1][1].append(value if value is not None and math.isfinite(value) else math.nan)
    return out


def _thin(xs: list[int], ys: list[float]) -> tuple[list[int], list[float]]:
    if len(xs) <= MAX_POINTS:
        return xs, ys
    size = math.ceil(2 * len(xs) / (MAX_POINTS - 2))
    keep = {0, len(xs) - 1}  # the line still starts and ends where the run did
    for start in range(0, len(xs), size):
        idx = [i for i in range(start, min(start + size, len(xs))) if math.isfinite(ys[i])]
        if idx:
            keep.update((min(idx, key=ys.__getitem__), max(idx, key=ys.__getitem__)))
        else:
            keep.add(start)  # keep the gap a non-finite stretch leaves
    order = sorted(keep)
    return [xs[i] for i in order], [ys[i] for i in order]


def _draw_run(ax: Axes, steps: list[int], values: list[Value], color: str, label: str) -> None:
    segments = _segments(steps, values)
    previous: tuple[int, float] | None = None
    labels = {"kept": label, "redone": f"{label}: redone after a restart"}
    for n, (xs, ys) in enumerate(segments):
        # Steps a later attempt redid are faded: the run's final state does not descend
        # from them, but the reader should still see what happened before the rollback.
        redo_from = min((later[0][0] for later in segments[n + 1 :]), default=None)
        cut = len(xs) if redo_from is None else bisect.bisect_left(xs, redo_from)
        parts = [
            ("kept", xs[:cut], ys[:cut]),
            ("redone", xs[max(cut - 1, 0) :], ys[max(cut - 1, 0) :]),
        ]
        for kind, px, py in parts:
            if not px or (kind == "redone" and cut == len(xs)):
                continue
            px, py = _thin(px, py)
            alpha = 1.0 if kind == "kept" else 0.35
            ax.plot(px, py, color=color, lw=1.4, alpha=alpha, label=labels.pop(kind, None))
        if previous is not None and math.isfinite(ys[0]) and math.isfinite(previous[1]):
            ax.plot([previous[0], xs[0]], [previous[1], ys[0]], color=color, lw=1.0, ls=":")
        previous = (xs[-1], ys[-1])
    bad = [s for s, v in zip(steps, values, strict=True) if v is not None and not math.isfinite(v)]
    if bad:
        # Non-finite values leave a gap; a cross on the top edge says what fell in it.
        ax.plot(
            bad,
            [0.96] * len(bad),
            transform=ax.get_xaxis_transform(),
            ls="none",
            marker="x",
            color=color,
            label=f"{label}: non-finite",
        )


def _draw_markers(ax: Axes, series: StepSeries) -> None:
    # Widest first and translucent: a fault detected and recovered from at the same step
    # still shows all three lines.
    groups: list[tuple[list[int], str, str, Literal["-", "--", ":"], float, float]] = [
        (series.faults, "fault injected", "#d62728", "-", 4.0, 0.35),
        (series.detections, "detected", "#ff7f0e", "--", 1.8, 0.9),
        (series.recoveries, "recovered / restart", "#2ca02c", ":", 1.6, 1.0),
    ]
    for steps, label, color, style, width, alpha in groups:
        if steps:
            # One collection for all of a kind: a detector firing every step of a long
            # persistent fault stays one SVG element, not thousands.
            ax.vlines(
                steps,
                0,
                1,
                transform=ax.get_xaxis_transform(),
                colors=color,
                linestyles=style,
                linewidths=width,
                alpha=alpha,
                label=label,
            )


def _draw_skipped(ax: Axes, series: StepSeries) -> None:
    # A skipped step's loss looks normal; the ring says its update never happened.
    by_step = dict(zip(series.steps, series.loss, strict=True))
    points = [(s, v) for s in series.skipped if (v := by_step.get(s)) is not None]
    points = [(s, v) for s, v in points if math.isfinite(v)]
    if points:
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs,
            ys,
            ls="none",
            marker="o",
            mfc="none",
            mec=FAULTED,
            ms=7,
            mew=1.4,
            label="update skipped",
        )


def _positive_span(values: list[Value]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return max(finite) / min(finite) if finite else 1.0


def render_plot(
    plot_id: str,
    title: str,
    ylabel: str,
    size: tuple[float, float],
    draw: Callable[[Axes], None],
    xlabel: str = "step",
) -> Plot:
    """One plot: ``draw`` fills the axes; titled, labelled, gridded, legend below."""
    import matplotlib
    from matplotlib.figure import Figure

    # Text as <text> (small, selectable, no glyph defs); the salt keeps clip-path ids of
    # several plots in one page apart.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": plot_id, "font.size": 9}):
        fig = Figure(figsize=size)
        ax = fig.add_subplot()
        draw(ax)
        ax.set_title(title, loc="left", fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, color="#e6e6e6", lw=0.6)
        # Below the axes, not on them: a legend must never hide the step it explains.
        ncols = 6 if size[0] > 6 else 3
        rows = math.ceil(len(ax.get_legend_handles_labels()[1]) / ncols)
        y = ax.yaxis
        ticks = y.get_major_formatter().format_ticks(list(y.get_majorticklocs()))
        ticks += y.get_minor_formatter().format_ticks(list(y.get_minorticklocs()))
        margins_in_inches(
            fig,
            left=MARGIN_LEFT + text_inches([_MATH.sub("", t) for t in ticks], 9),
            right=MARGIN_RIGHT,
            top=MARGIN_TOP,
            bottom=MARGIN_BOTTOM + LEGEND_ROW * rows,
        )
        fig.legend(loc="lower center", ncols=ncols, fontsize=7.5, frameon=False)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return Plot(plot_id, title, inline_svg(buf.getvalue(), plot_id))


def margins_in_inches(
    fig: Figure, *, left: float, right: float, top: float, bottom: float, **gaps: float
) -> None:
    """Set the room between ``fig``'s edges and its axes, in inches (``gaps``: matplotlib's
    ``hspace`` and ``wspace``, fractions of a panel)."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        top=1 - top / height,
        bottom=bottom / height,
        **gaps,
    )


def text_inches(texts: Sequence[str], points: float) -> float:
    """The widest of ``texts`` in the default font at ``points``, in inches (as the SVG
    renderer measures it)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    font, measure = FontProperties(size=points), TextToPath()
    widths = [measure.get_text_width_height_descent(t, font, ismath=False)[0] for t in texts]
    return max(widths, default=0.0) / 72


# A log axis' labels are mathtext ($\mathdefault{10^{-3}}$): measured without the markup.
_MATH = re.compile(r"\\mathdefault|\\times|[${}^]")

_ID_REFS = re.compile(r'(\bid="|href="#|url\(#)')


def inline_svg(svg: str, prefix: str) -> str:
    """SVG fit to paste into HTML: no XML prolog, ids prefixed so plots never share one."""
    svg = svg[svg.index("<svg") :]
    svg = _ID_REFS.sub(lambda m: f"{m.group(1)}{prefix}-", svg)
    return svg.replace("<svg ", f'<svg class="plot-svg" role="img" aria-label="{prefix}" ', 1)


def render_plots(faulted: StepSeries, baseline: StepSeries | None, id_prefix: str) -> list[Plot]:
    """The scenario's plots: loss; loss scale when any step had one; gradient norm."""

    def plot_of(
        name: str, title: str, ylabel: str, pick: Callable[[StepSeries], list[Value]]
    ) -> Plot:
        def draw(ax: Axes) -> None:
            if baseline is not None:
                _draw_run(ax, baseline.steps, pick(baseline), BASELINE, "baseline")
            _draw_run(ax, faulted.steps, pick(faulted), FAULTED, "faulted")
            _draw_markers(ax, faulted)
            if name == "loss":
                _draw_skipped(ax, faulted)
            values = pick(faulted) + (pick(baseline) if baseline else [])
            if name == "loss-scale":
                ax.set_yscale("log", base=2)
            elif name == "grad-norm" and _positive_span(values) > 100:
                ax.set_yscale("log")

        size = (9.0, 3.4) if name == "loss" else (4.6, 3.2)
        return render_plot(f"{id_prefix}-{name}", title, ylabel, size, draw)

    runs = [faulted] + ([baseline] if baseline else [])
    plots = [plot_of("loss", "Loss", "loss", lambda s: s.loss)]
    # A trainer without fp16 journals no loss scale; one without a norm, no norm.
    if any(v is not None for run in runs for v in run.loss_scale):
        plots.append(plot_of("loss-scale", "Loss scale", "loss scale", lambda s: s.loss_scale))
    if any(v is not None for run in runs for v in run.grad_norm):
        plots.append(plot_of("grad-norm", "Gradient norm", "grad norm", lambda s: s.grad_norm))
    return plots
