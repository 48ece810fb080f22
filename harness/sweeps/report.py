"""A sweep's reports: sweep.json (everything, strict JSON), sweep.md (the table and the
differences) and sweep.html (the same with a plot per metric; inline SVG, no scripts)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.records.journal import json_safe
from harness.scorecard.render.htmlstyle import CSS
from harness.scorecard.render.plots import BASELINE, FAULTED, Plot, render_plot
from harness.sweeps.run_sweep import RunRecord, SweepRun
from harness.sweeps.stats import ALPHA, CONFIDENCE, Spread
from harness.sweeps.summary import CellSummary, Comparison, compare, summarize

if TYPE_CHECKING:
    from matplotlib.axes import Axes

SWEEP_VERSION = 1
FILES = ("sweep.json", "sweep.md", "sweep.html")


def sweep_data(run: SweepRun, cells: list[CellSummary], pairs: list[Comparison]) -> dict[str, Any]:
    """Everything a sweep found, as plain data (what sweep.json holds)."""
    sweep = run.sweep
    return {
        "version": SWEEP_VERSION,
        "tightrope": run.version,
        "sweep": sweep.name,
        "description": sweep.description,
        "source": sweep.source,
        "started": run.started,
        "seconds": run.seconds,
        "complete": run.complete,
        "interrupted": run.interrupted,
        "grid": {k: list(v) for k, v in sweep.grid},
        "seeds": list(sweep.seeds),
        "min_success": sweep.min_success,
        "scenario": sweep.scenario.model_dump(mode="json", by_alias=True, exclude_defaults=True),
        "cells": [c.to_dict() for c in cells],
        "comparisons": [c.to_dict() for c in pairs],
        "runs": [r.to_dict() for r in run.records],
    }


def write_reports(
    run: SweepRun, out_dir: Path, cells: list[CellSummary] | None = None
) -> list[Path]:
    """Write the three reports into ``out_dir`` (from ``cells``, the run's `summarize`,
    when the caller has it already); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = summarize(run) if cells is None else cells
    pairs = compare(run, cells)
    data = sweep_data(run, cells, pairs)
    paths = [out_dir / name for name in FILES]
    paths[0].write_text(json.dumps(json_safe(data), indent=2, allow_nan=False, default=str) + "\n")
    paths[1].write_text(render_markdown(run, cells, pairs))
    paths[2].write_text(render_html(run, cells, pairs))
    return paths


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate * 100:.0f}%"


def _spread(s: Spread | None, digits: int = 3) -> str:
    if s is None:
        return "n/a"
    return f"{s.median:.{digits}f} [{s.p25:.{digits}f}, {s.p75:.{digits}f}]"


def table_rows(run: SweepRun, cells: list[CellSummary]) -> list[list[str]]:
    """The cells as rows of text: the same columns in every report."""
    rows = []
    for c in cells:
        failing = ", ".join(f"{name} {n}" for name, n in c.failed_checks.items()) or "none"
        meets = "" if c.meets(run.sweep.min_success) else " (below min)"
        rows.append(
            [
                c.cell.slug,
                c.cell.label,
                f"{c.passed}/{c.runs}",
                _pct(c.success) + meets,
                f"{_pct(c.interval[0])} to {_pct(c.interval[1])}",
                _spread(c.final_loss),
                str(c.nonfinite_losses + c.errored),
                _spread(c.run_seconds, 1),
                _spread(c.steps_lost, 0),
                failing,
            ]
        )
    return rows


COLUMNS = [
    "cell",
    "settings",
    "passed",
    "success",
    f"{CONFIDENCE * 100:.0f}% interval (Wilson)",
    "final loss: median [p25, p75]",
    "no final loss",
    "run seconds: median [p25, p75]",
    "steps lost: median [p25, p75]",
    "checks not passed (runs)",
]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _differences(pairs: list[Comparison]) -> list[str]:
    return [p.note for p in pairs if p.success_p_holm < ALPHA or (p.loss_p_holm or 1) < ALPHA]


def render_markdown(run: SweepRun, cells: list[CellSummary], pairs: list[Comparison]) -> str:
    """sweep.md: what was swept, the cells' table, the differences the data shows."""
    sweep = run.sweep
    lines = [f"# Sweep: {sweep.name}", ""]
    if sweep.description:
        lines += [sweep.description.strip(), ""]
    status = "complete" if run.complete else f"partial ({len(run.records)}/{sweep.runs} runs)"
    lines += [
        f"{len(cells)} cells x {len(sweep.seeds)} seeds = {sweep.runs} runs, {status}; "
        f"{run.seconds:.0f} s this time ({sum(r.cached for r in run.records)} runs reused "
        f"from the cache). A run succeeds when every check passed.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(_md_cell(t) for t in row) + " |" for row in table_rows(run, cells)]
    lines += ["", "## Differences", ""]
    found = _differences(pairs)
    if found:
        lines += [f"- {n}" for n in found]
    else:
        lines.append(
            f"No pair of cells differs at {ALPHA:g} (Fisher's exact test on successes, "
            "Mann-Whitney U on final losses, Holm-corrected over the pairs)."
        )
    if pairs:
        lines += [
            "",
            "| pair | success p (Holm) | final loss p (Holm) | note |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| cell{p.a:02d} / cell{p.b:02d} | {p.success_p:.3g} ({p.success_p_holm:.3g}) | "
            f"{_p(p.loss_p)} ({_p(p.loss_p_holm)}) | {_md_cell(p.note)} |"
            for p in pairs
        ]
    lines.append("")
    return "\n".join(lines)


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _e(text: object) -> str:
    return escape(str(text))


def _plots(run: SweepRun, cells: list[CellSummary]) -> list[Plot]:
    """Success rate with its interval; each seed's final loss; run time; steps lost."""
    xs = list(range(len(cells)))
    # The cell's settings under its point when they are short, else its name (the table
    # above maps names to settings).
    short = all(len(c.cell.label) <= 28 for c in cells)
    names = [c.cell.label.replace(", ", "\n") if short else c.cell.slug for c in cells]

    def ticks(ax: Axes) -> None:
        ax.set_xticks(xs, names, rotation=30 if len(xs) > 6 else 0)
        ax.set_xlim(-0.6, len(xs) - 0.4)

    def success(ax: Axes) -> None:
        rates = [c.success or 0.0 for c in cells]
        low = [r - c.interval[0] for r, c in zip(rates, cells, strict=True)]
        high = [c.interval[1] - r for r, c in zip(rates, cells, strict=True)]
        ax.errorbar(xs, rates, yerr=[low, high], fmt="o", color=FAULTED, capsize=4,
                    label=f"success rate, {CONFIDENCE * 100:.0f}% Wilson interval")  # fmt: skip
        if run.sweep.min_success is not None:
            ax.axhline(run.sweep.min_success, color="#c0392b", ls="--", lw=1, label="min_success")
        ax.set_ylim(-0.05, 1.05)
        ticks(ax)

    def per_seed(value: Callable[[RunRecord], float | None]) -> Callable[[Axes], None]:
        def draw(ax: Axes) -> None:
            for x, c in zip(xs, cells, strict=True):
                found = [value(r) for r in run.of_cell(c.cell)]
                ys = [float(v) for v in found if v is not None and math.isfinite(v)]
                ax.plot([x] * len(ys), ys, "o", color=BASELINE, ms=3.5, alpha=0.7,
                        label="a seed" if x == 0 else None)  # fmt: skip
                if ys:
                    ax.plot([x - 0.25, x + 0.25], [statistics.median(ys)] * 2, color=FAULTED,
                            lw=2, label="median" if x == 0 else None)  # fmt: skip
            ticks(ax)

        return draw

    size = (6.4, 3.0)
    return [
        render_plot("sweep-success", "Success rate per cell", "success rate", size, success,
                    xlabel="cell"),
        render_plot("sweep-loss", "Final loss per seed", "final loss", size,
                    per_seed(lambda r: r.final_loss), xlabel="cell"),
        render_plot("sweep-seconds", "Run time per seed", "seconds", size,
                    per_seed(lambda r: r.result.run_seconds), xlabel="cell"),
        render_plot("sweep-lost", "Steps lost per seed", "steps", size,
                    per_seed(lambda r: r.steps_lost), xlabel="cell"),
    ]  # fmt: skip


def render_html(run: SweepRun, cells: list[CellSummary], pairs: list[Comparison]) -> str:
    """sweep.html: one self-contained page."""
    sweep = run.sweep
    head = "".join(f"<th>{_e(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(t)}</td>" for t in row) + "</tr>"
        for row in table_rows(run, cells)
    )
    found = _differences(pairs)
    differences = (
        "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in found) + "</ul>"
        if found
        else f"<p>No pair of cells differs at {ALPHA:g} (Holm-corrected).</p>"
    )
    plots = "".join(
        f'<figure class="plot" id="{p.id}">{p.svg}</figure>' for p in _plots(run, cells)
    )
    status = "complete" if run.complete else f"partial: {len(run.records)}/{sweep.runs} runs"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tightrope sweep: {_e(sweep.name)}</title>
<style>{CSS}</style></head>
<body><div class="page">
<header><h1>Sweep: {_e(sweep.name)}</h1>
<p>{_e(sweep.description)}</p>
<p>{len(cells)} cells x {len(sweep.seeds)} seeds = {sweep.runs} runs ({_e(status)}),
started {_e(run.started)}. A run succeeds when every check passed.</p></header>
<main>
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<h2>Differences</h2>
{differences}
<div class="plots">{plots}</div>
</main>
<footer>tightrope {_e(run.version)} · sweep version {SWEEP_VERSION} · Fisher's exact test on
successes and Mann-Whitney U on final losses, Holm-corrected over all pairs of cells.</footer>
</div></body></html>
"""
