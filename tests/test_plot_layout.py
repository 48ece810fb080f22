"""The HTML scorecard's plots are laid out with fixed margins (measured from their labels,
not by matplotlib's constrained layout, which took about half of a scorecard's rendering):
every text of every plot lies inside its figure and on no other text, with the long layer
names of a large model too. Each figure the page renders is caught as it is saved, then
measured by matplotlib itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from harness.running.results import ScenarioResult, SuiteResult
from harness.scorecard.render import write_scorecards
from harness.scorecard.render.plots import render_plot
from tests.microscope_support import LAYERS, write_journal, write_microscope
from tests.scorecard_support import make_suite

#: Layer names as a large model's: long, and more of them than the ridgelines show.
LONG_LAYERS = [f"model.layers.{i}.self_attention.query_key_value" for i in range(14)]
#: Slack for the renderer's rounding, in pixels.
SLACK = 1.0


def _saved_figures(monkeypatch: pytest.MonkeyPatch, card: Any) -> list[Figure]:
    figures: list[Figure] = []
    save = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> None:
        figures.append(self)
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    card()
    return figures


def _undrawn_tick_labels(fig: Figure) -> set[int]:
    """Tick labels matplotlib keeps for ticks beyond the axis' view: never drawn."""
    undrawn = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                if not low - 1e-9 * abs(high - low) <= tick.get_loc() <= high + 1e-9 * abs(high):
                    undrawn.update((id(tick.label1), id(tick.label2)))
    return undrawn


def _texts(fig: Figure) -> list[tuple[str, Bbox]]:
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    undrawn = _undrawn_tick_labels(fig)
    found = []
    for text in fig.findobj(Text):
        shown = text.get_visible() and (text.axes is None or text.axes.get_visible())
        if shown and text.get_text().strip() and id(text) not in undrawn:
            found.append((text.get_text(), text.get_window_extent(renderer)))
    return found


def _problems(fig: Figure) -> list[str]:
    """Texts out of the figure, and pairs of texts on each other."""
    inside = fig.bbox.padded(SLACK)
    texts = _texts(fig)
    out = [f"{s!r} outside the figure" for s, box in texts if not inside.contains(*box.p0)]
    out += [f"{s!r} outside the figure" for s, box in texts if not inside.contains(*box.p1)]
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1 :]:
            if box_a.padded(-SLACK).overlaps(box_b.padded(-SLACK)):
                out.append(f"{a!r} on {b!r}")
    return out


def _suite(out: Path, layers: list[str]) -> SuiteResult:
    run = out / "runs" / "blowup"
    write_microscope(run, ranks=2, layers=layers, hot_layer=layers[3])
    write_journal(run, diagnosed=[layers[3]])
    scenario = ScenarioResult(
        name="blowup", fault_class="numeric", weight=1.0, checks=[], run_dir="runs/blowup"
    )
    return SuiteResult(suite="micro", preset="tiny", scenarios=[scenario], seconds=1.0)


def _wide_labels() -> None:
    """Line plots whose y labels are wide: large numbers, and a log axis of many decades."""

    def large(ax: Any) -> None:
        ax.plot([1, 2, 3], [1234567.0, -2345678.0, 7654321.0], label="faulted")

    def decades(ax: Any) -> None:
        ax.plot([1, 2, 3], [3e-9, 0.02, 7e4], label="faulted")
        ax.set_yscale("log")

    for draw in (large, decades):
        render_plot(draw.__name__, "Wide labels", "grad norm", (4.6, 3.2), draw)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param("few-layers", marks=pytest.mark.slow),  # a scorecard each: ~4 s
        pytest.param("long-names", marks=pytest.mark.slow),
        "wide-labels",
    ],
)
def test_no_text_of_a_plot_is_cut_off_or_drawn_over_another(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def card() -> None:
        if case == "few-layers":  # loss, loss scale and gradient norm plots; the microscope's
            write_scorecards(make_suite(tmp_path), tmp_path)
            write_scorecards(_suite(tmp_path / "micro", LAYERS), tmp_path / "micro")
        elif case == "long-names":
            write_scorecards(_suite(tmp_path, LONG_LAYERS), tmp_path)
        else:
            _wide_labels()

    figures = _saved_figures(monkeypatch, card)
    assert len(figures) >= 2
    problems = {n: p for n, fig in enumerate(figures) if (p := _problems(fig))}
    assert not problems, problems


def test_the_check_sees_a_label_cut_off_and_labels_on_each_other() -> None:
    """Negative control: margins too small for the labels."""
    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1000000])
    ax.set_ylabel("a long label of the y axis")
    ax.set_title("title")
    fig.subplots_adjust(left=0.01, bottom=0.01)
    assert any("outside the figure" in p for p in _problems(fig))
    fig = Figure(figsize=(4, 3))
    fig.text(0.5, 0.5, "one text")
    fig.text(0.52, 0.5, "another text")
    assert _problems(fig) == ["'one text' on 'another text'"]
