"""The scorecard's microscope section of one scenario: gradient flow, activations, latency.

Drawn from the run's microscope files (harness/records/microscope_file.py) and marked with
its journal's events. A run without microscope records gets one quiet line; a view that
cannot be drawn gets a note naming why, never an error for the page.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

import numpy as np

from harness.errors import JournalError
from harness.records.journal import read_journal
from harness.records.microscope_file import Microscope, MicroscopeFileError, read_microscope
from harness.running.results import ScenarioResult
from harness.scorecard.microscope_figures import (
    Diagnosis,
    Marks,
    allreduce_rows,
    diagnosed_rows,
    grid,
    marks_from_journal,
    pick_rank,
    ridge_records,
)
from harness.scorecard.render.microscope_plots import heatmap, latency_map, ridge_panels, ridgelines
from harness.scorecard.render.plots import Plot
from harness.scorecard.text import clean_text, plural

QUIET = "no microscope records"


def _e(text: object) -> str:
    return escape(clean_text(str(text)))


def _note(text: str) -> str:
    return f'<p class="note">{_e(text)}</p>'


def _figure(plot: Plot, caption: str, wide: bool = True) -> str:
    cls = "plot wide" if wide else "plot"
    return (
        f'<figure class="{cls}" id="{plot.id}">{plot.svg}'
        f'<figcaption class="note" style="padding:2px 6px">{_e(caption)}</figcaption></figure>'
    )


def _load(run_dir: Path) -> tuple[Microscope | None, list[str]]:
    try:
        microscope = read_microscope(run_dir, warn=False)  # skipped: noted on the page
    except (MicroscopeFileError, OSError) as exc:
        return None, [f"microscope unreadable: {exc}"]
    notes = [f"skipped {plural(len(microscope.skipped), 'unreadable microscope chunk')}"]
    return microscope, notes if microscope.skipped else []


def _marks(run_dir: Path) -> tuple[Marks, list[str]]:
    try:
        return marks_from_journal(read_journal(run_dir, warn=False)), []
    except (JournalError, OSError, ValueError, TypeError) as exc:
        return Marks(), [f"journal unreadable, so faults and recoveries are not marked: {exc}"]


def diagnosis_caption(
    rows: dict[int, Diagnosis], diagnoses: list[Diagnosis], layers: list[str]
) -> str:
    """The caption's words on the trainer's diagnoses ("" when there were none)."""
    if not diagnoses:
        return ""
    # The first diagnosis that named a layer leads; one that named none only when all did.
    first = next((d for d in diagnoses if d.layers), diagnoses[0])
    others = len(diagnoses) - 1
    more = f" (and {others} other diagnos{'is' if others == 1 else 'es'})" if others else ""
    rule = f" by its rule {first.rule}" if first.rule else ""
    if not first.layers:
        return (
            f" The trainer's diagnosis at step {first.step}{rule} named no layer (a cause "
            f"that reached every layer alike){more}; it is the trainer's claim."
        )
    named = ", ".join(first.layers)
    shown = sorted({layers[r] for r in rows})
    where = (
        f"; outlined: {', '.join(shown)}"
        if shown
        else "; the microscope recorded no layer of that name, so nothing is outlined"
    )
    return (
        f" The trainer's diagnosis{rule} named {named} at step {first.step}{more}{where}. "
        "It is the trainer's claim, not a verdict of this harness."
    )


def _gradient_views(micro: Microscope, rank: int, marks: Marks, slug: str) -> list[str]:
    series = micro.ranks[rank]
    rows = diagnosed_rows(micro.layers, marks.diagnoses)
    out = []
    g = grid(series, "grad_norm")
    grouped = (
        f" {len(series)} records are grouped {g.group} to a column, each column showing its "
        "group's largest value."
        if g.group > 1
        else ""
    )
    caption = (
        f"Per-layer gradient norm on rank {rank}, one column per recorded step (evenly "
        f"spaced; records are denser around an anomaly).{grouped} Magenta: non-finite; "
        "blank: not measured or zero. Red lines: faults injected; green dashes: recoveries, "
        "restarts and resumes." + diagnosis_caption(rows, marks.diagnoses, micro.layers)
    )
    out.append(
        _figure(
            heatmap(
                f"micro-{slug}-grad",
                f"Gradient flow (rank {rank})",
                "gradient norm",
                g,
                micro.layers,
                marks,
                sorted(rows),
            ),
            caption,
        )
    )
    ratio = grid(series, "update_ratio")
    if (~np.isnan(ratio.values)).any():
        out.append(
            _figure(
                heatmap(
                    f"micro-{slug}-update",
                    f"Update / weight ratio (rank {rank})",
                    "||Δw|| / ||w||",
                    ratio,
                    micro.layers,
                    marks,
                    sorted(rows),
                ),
                "Per-layer ||w_after - w_before|| / ||w_before|| on the same columns; blank "
                "where it was not measured (the recorder takes it at periodic records and "
                "after an anomaly, not in the window before one) or zero (a skipped update).",
            )
        )
    records, around = ridge_records(series)
    if records:
        panels = ridge_panels(series, records, sorted(rows))
        shown = (
            ""
            if len(panels) == len(micro.layers)
            else f" {len(panels)} of {len(micro.layers)} layers shown: the diagnosed ones and "
            "those with the most overflowed or non-finite activations."
        )
        which = (
            "the records around the anomaly (before, at and after it)"
            if around
            else "a few periodic records (no anomaly was recorded)"
        )
        out.append(
            _figure(
                ridgelines(f"micro-{slug}-act", series, micro.layers, records, panels),
                f"|activation| histograms per layer on rank {rank}, one curve per step for "
                f"{which}, each curve normalised to its total count.{shown} Zero, overflow "
                "(≥1e8) and non-finite bins are drawn apart on the right and left: any count "
                "there is marked, however small.",
            )
        )
    else:
        out.append(_note("no activation histograms were recorded"))
    return out


def _comm_views(micro: Microscope, slug: str) -> list[str]:
    out = []
    ranks, matrix = micro.latency_matrix()
    if (~np.isnan(matrix)).any():
        out.append(
            _figure(
                latency_map(f"micro-{slug}-latency", ranks, matrix),
                "Median point-to-point round trip from each rank (row) to each other rank "
                "(column), in µs, over every probe; – where none ran.",
                wide=False,
            )
        )
    else:
        out.append(_note("no point-to-point probes were recorded"))
    body = "".join(
        f"<tr><td>{rank}</td><td class='num'>{n}</td>"
        f"<td class='num'>{_ms(median)}</td><td class='num'>{_ms(p95)}</td></tr>"
        for rank, n, median, p95 in allreduce_rows(micro)
    )
    out.append(
        f'<div id="micro-{slug}-allreduce"><table class="checks"><thead><tr><th>rank</th>'
        "<th class='num'>records</th><th class='num'>all-reduce median (ms)</th>"
        f"<th class='num'>p95 (ms)</th></tr></thead><tbody>{body}</tbody></table></div>"
    )
    return out


def _ms(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{value:.3g}"


def microscope_section(r: ScenarioResult, root: Path, slug: str) -> str:
    """The scenario's microscope views, or one quiet line when its run recorded none."""
    if not r.run_dir:
        return _note(QUIET)
    run_dir = root / r.run_dir
    micro, notes = _load(run_dir)
    if micro is None or not micro:
        return "".join(_note(n) for n in notes) + _note(QUIET)
    marks, more = _marks(run_dir)
    notes += more
    rank = pick_rank(micro, marks)
    try:
        parts = _gradient_views(micro, rank, marks, slug)
        if len(micro.ranks) >= 2:
            parts += _comm_views(micro, slug)
    except Exception as exc:  # a view that cannot be drawn costs the section, not the page
        parts = [_note(f"microscope views could not be drawn: {type(exc).__name__}: {exc}")]
    return (
        f'<div class="microscope" id="micro-{slug}"><h3>Microscope</h3>'
        + "".join(_note(n) for n in notes)
        + f'<div class="plots">{"".join(parts)}</div></div>'
    )
