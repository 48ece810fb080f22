"""The scorecard's microscope section: gradient-flow heatmap, activation ridgelines, latency map."""

from __future__ import annotations

import base64
import html
import io
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.records.journal import Journal, JournalWriter, read_journal
from harness.records.microscope_file import N_BINS, WHY_PERIODIC, RankSeries, read_microscope
from harness.running.results import ScenarioResult
from harness.scorecard.microscope_figures import (
    MAX_COLUMNS,
    Diagnosis,
    diagnosed_rows,
    grid,
    marks_from_journal,
    pick_rank,
    ridge_records,
)
from harness.scorecard.render.microscope_plots import (
    DIAGNOSED,
    FAULT,
    MAX_PANELS,
    NONFINITE,
    ridge_panels,
)
from harness.scorecard.render.microscope_section import QUIET, diagnosis_caption, microscope_section
from tests.microscope_support import (
    BLOW_UP_STEP,
    HOT_LAYER,
    LAYERS,
    write_journal,
    write_microscope,
)


def _scenario(run: str | None = "runs/x") -> ScenarioResult:
    return ScenarioResult(name="x", fault_class="numeric", weight=1.0, checks=[], run_dir=run)


@dataclass(frozen=True)
class Rendered:
    root: Path
    html: str

    @property
    def run(self) -> Path:
        return self.root / "runs" / "x"

    def figure(self, plot_id: str) -> str:
        assert f'id="{plot_id}"' in self.html, f"no figure {plot_id}"
        return self.html.split(f'id="{plot_id}"', 1)[1].split("</figure>", 1)[0]

    def columns(self) -> int:
        return len(read_microscope(self.run).ranks[0])


def _render(root: Path, micro: dict[str, Any] | None, **journal: Any) -> Rendered:
    if micro is not None:
        write_microscope(root / "runs" / "x", **micro)
    write_journal(root / "runs" / "x", **journal)
    return Rendered(root, microscope_section(_scenario(), root, "x"))


# One render per kind of run, shared by the tests that look at it (drawing costs seconds).
@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """One rank, a blow-up in HOT_LAYER at BLOW_UP_STEP, the trainer's diagnosis naming it."""
    return _render(tmp_path_factory.mktemp("diag"), {}, diagnosed=[HOT_LAYER])


@pytest.fixture(scope="module")
def undiagnosed(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """The same run without a ``diagnosed`` event."""
    return _render(tmp_path_factory.mktemp("plain"), {})


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """No anomaly, no fault; a diagnosis that named no layer."""
    return _render(tmp_path_factory.mktemp("quiet"), {"anomaly": None}, fault_at=None, diagnosed=[])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """Two ranks with probes and all-reduce times; the fault hit rank 1."""
    return _render(tmp_path_factory.mktemp("two"), {"ranks": 2}, fault_rank=1)


def _images(svg: str) -> list[np.ndarray]:
    """The PNG images an SVG embeds, decoded to RGB arrays."""
    from PIL import Image

    found = re.findall(r'href="data:image/png;base64,([^"]+)"', svg)
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(d))).convert("RGB"), dtype=int)
        for d in found
    ]


def _cells(svg: str, columns: int) -> list[np.ndarray]:
    """The heatmap's images: one pixel per cell, layers x recorded steps (not the colour bar)."""
    return [im for im in _images(svg) if im.shape[:2] == (len(LAYERS), columns)]


def test_heatmap_hot_cell_is_the_blown_up_layer_at_its_step(diagnosed: Rendered) -> None:
    from matplotlib import colormaps

    svg = diagnosed.figure("micro-x-grad")
    series = read_microscope(diagnosed.run).ranks[0]
    (image,) = _cells(svg, len(series))
    hottest = np.array(colormaps["viridis"](1.0)[:3]) * 255
    distance = np.abs(image - hottest).sum(axis=2)
    row, col = np.unravel_index(int(distance.argmin()), distance.shape)
    assert distance[row, col] < 10
    assert LAYERS[row] == HOT_LAYER and int(series.steps[col]) == BLOW_UP_STEP
    # Only that cell is hot: the others are far down the colour scale.
    assert np.sort(distance.ravel())[1] > 100
    assert f"stroke: {FAULT}" in svg  # the fault line
    assert ">non-finite</text>" not in svg  # every figure was finite


def test_update_ratio_panel_is_drawn(diagnosed: Rendered) -> None:
    svg = diagnosed.figure("micro-x-update")
    assert len(_cells(svg, diagnosed.columns())) == 1


def test_diagnosed_layer_is_outlined_and_named_as_the_trainers_claim(diagnosed: Rendered) -> None:
    svg = diagnosed.figure("micro-x-grad")
    assert f"stroke: {DIAGNOSED}" in svg
    caption = html.unescape(svg.split("<figcaption", 1)[1])
    assert f"diagnosis named {HOT_LAYER} at step {BLOW_UP_STEP}" in caption
    assert "outlined: " + HOT_LAYER in caption and "the trainer's claim" in caption


def test_no_diagnosed_event_highlights_nothing(undiagnosed: Rendered) -> None:
    svg = undiagnosed.figure("micro-x-grad")
    assert f"stroke: {DIAGNOSED}" not in svg and "diagnosis" not in svg


def test_diagnosis_naming_no_layer_outlines_nothing_and_says_so(quiet: Rendered) -> None:
    svg = quiet.figure("micro-x-grad")
    assert f"stroke: {DIAGNOSED}" not in svg and "named no layer" in svg


def test_no_fault_draws_no_fault_line(quiet: Rendered) -> None:
    assert f"stroke: {FAULT}" not in quiet.figure("micro-x-grad")


def test_ridgelines_show_the_anomaly_window_with_its_nonfinite_bins(diagnosed: Rendered) -> None:
    svg = diagnosed.figure("micro-x-act")
    labels = re.findall(r">(\d+)</text>", svg)
    for step in range(BLOW_UP_STEP - 3, BLOW_UP_STEP + 4):
        assert str(step) in labels
    assert "5" not in labels  # a periodic record far from the anomaly
    assert f"stroke: {NONFINITE}" in svg  # the nan/inf bin's stem
    assert "around the anomaly" in svg


def test_ridgelines_without_anomaly_show_a_few_periodic_records_and_no_nonfinite(
    quiet: Rendered,
) -> None:
    svg = quiet.figure("micro-x-act")
    assert "no anomaly was recorded" in svg
    assert f"stroke: {NONFINITE}" not in svg
    rows, around = ridge_records(read_microscope(quiet.run).ranks[0])
    assert not around and 2 <= len(rows) <= 6


def test_run_without_records_gets_the_quiet_line(tmp_path: Path) -> None:
    page = _render(tmp_path, None).html
    assert page == f'<p class="note">{QUIET}</p>'
    assert microscope_section(_scenario(None), tmp_path, "x") == page


def test_one_rank_run_has_no_latency_map(diagnosed: Rendered) -> None:
    assert "micro-x-latency" not in diagnosed.html
    assert "micro-x-allreduce" not in diagnosed.html


def test_two_rank_run_gets_the_latency_map_with_its_figures(two_ranks: Rendered) -> None:
    texts = re.findall(r">([^<>]+)</text>", two_ranks.figure("micro-x-latency"))
    assert "42" in texts and "87.5" in texts and texts.count("–") == 2  # the diagonal
    table = two_ranks.html.split('id="micro-x-allreduce"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr><td>(\d)</td>(.*?)</tr>", table)
    assert [r for r, _ in rows] == ["0", "1"]
    cells = [re.findall(r">([^<]*)</td>", rest) for _, rest in rows]
    assert cells[1][1:] == ["11", "11"] and cells[0][1:] == ["3", "3"]


def test_the_rank_the_fault_hit_is_shown(two_ranks: Rendered) -> None:
    assert "Gradient flow (rank 1)" in two_ranks.html
    micro = read_microscope(two_ranks.run)
    journal = read_journal(two_ranks.run, warn=False)
    assert pick_rank(micro, marks_from_journal(journal)) == 1
    assert pick_rank(micro, marks_from_journal(Journal([]))) == 0  # no fault: rank 0


def test_recoveries_include_a_resume(tmp_path: Path) -> None:
    write_journal(tmp_path, fault_at=None, resume_at=40)
    marks = marks_from_journal(read_journal(tmp_path, warn=False))
    assert marks.recoveries == [40] and marks.faults == []


def test_a_restart_journaled_at_step_0_is_marked_where_training_resumed(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        w.emit("run_start", 0, world_size=1, pid=1, host="test")
        for step in range(1, 16):
            w.emit("step", step, loss=1.0)
        # The restarted process, before it knows its step; it resumes from step 10.
        w.emit("run_start", 0, world_size=1, pid=2, host="test")
        w.emit("restart", 0, count=1)
        w.emit("checkpoint_loaded", 0, path="ckpt/step-10")
        for step in range(11, 20):
            w.emit("step", step, loss=1.0)
    assert marks_from_journal(read_journal(tmp_path, warn=False)).recoveries == [10]
    # Negative control: the first attempt alone (its run_start and steps) marks nothing.
    first = Journal(list(read_journal(tmp_path, warn=False)[:16]))
    assert marks_from_journal(first).recoveries == []


def test_long_run_is_capped_in_columns_and_keeps_the_spike(tmp_path: Path) -> None:
    write_microscope(tmp_path, steps=1600, anomaly=1234)
    series = read_microscope(tmp_path).ranks[0]
    assert len(series) > MAX_COLUMNS
    g = grid(series, "grad_norm")
    assert g.values.shape[1] <= MAX_COLUMNS and g.group > 1
    row, col = np.unravel_index(int(np.nanargmax(g.values)), g.values.shape)
    assert LAYERS[row] == HOT_LAYER and g.first[col] <= 1234 <= g.last[col]


def test_nonfinite_gradient_is_drawn_apart_with_a_legend_entry(tmp_path: Path) -> None:
    run = _render(tmp_path, {"blow_up_norm": math.inf})
    svg = run.figure("micro-x-grad")
    assert ">non-finite</text>" in svg
    series = read_microscope(run.run).ranks[0]
    images = _cells(svg, len(series))
    assert len(images) == 2  # the log-scaled figures, then the non-finite cells
    magenta = np.array([int(NONFINITE[i : i + 2], 16) for i in (1, 3, 5)])
    hit = np.nonzero(np.abs(images[1] - magenta).sum(axis=2) < 10)
    assert [LAYERS[r] for r in hit[0]] == [HOT_LAYER]
    assert [int(series.steps[c]) for c in hit[1]] == [BLOW_UP_STEP]


def test_caption_names_the_first_diagnosis_that_named_a_layer() -> None:
    diagnoses = [
        Diagnosis(step=12, rank=0, layers=[]),
        Diagnosis(step=30, rank=1, layers=[HOT_LAYER], rule="largest_swing"),
    ]
    rows = diagnosed_rows(LAYERS, diagnoses)
    assert [LAYERS[r] for r in rows] == [HOT_LAYER]
    text = diagnosis_caption(rows, diagnoses, LAYERS)
    assert f"rule largest_swing named {HOT_LAYER} at step 30 (and 1 other diagnosis)" in text
    # A module name outlines the layers inside it; a name the microscope lacks, none.
    assert [LAYERS[r] for r in diagnosed_rows(LAYERS, [Diagnosis(1, 0, ["blocks"])])] == [
        "blocks.0",
        "blocks.1",
        "blocks.2",
    ]
    lost = [Diagnosis(1, 0, ["head"])]
    assert diagnosed_rows(LAYERS, lost) == {}
    assert "nothing is outlined" in diagnosis_caption({}, lost, LAYERS)


def test_many_layers_show_the_diagnosed_and_the_overflowed_first() -> None:
    n_layers, records = 20, 4
    hist = np.zeros((records, n_layers, N_BINS), dtype=np.int64)
    hist[:, :, 16] = 100  # every layer: values near 1
    hist[2, 17, -2] = 1  # one overflowed value in layer 17
    hist[3, 9, -1] = 1  # one non-finite value in layer 9
    nan = np.full((records, n_layers), np.nan, dtype=np.float32)
    series = RankSeries(
        rank=0,
        steps=np.arange(records, dtype=np.int64),
        why=np.full(records, WHY_PERIODIC, dtype=np.uint8),
        wall=np.zeros(records),
        restart=np.zeros(records, dtype=np.int64),
        grad_norm=nan,
        weight_norm=nan,
        update_ratio=nan,
        act_hist=hist,
        allreduce_ms=np.full(records, np.nan, dtype=np.float32),
    )
    panels = ridge_panels(series, range(records), keep=[3])
    assert len(panels) == MAX_PANELS and panels == sorted(panels)
    assert {3, 9, 17} <= set(panels)
    # Few layers: every one, whatever is kept.
    few = replace(series, act_hist=hist[:, :5])
    assert ridge_panels(few, range(records), keep=[]) == [0, 1, 2, 3, 4]
