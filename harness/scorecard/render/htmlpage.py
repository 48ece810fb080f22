"""scorecard.html: one self-contained page (inline CSS and SVG, no scripts, no URLs)."""

from __future__ import annotations

from html import escape
from pathlib import Path

from harness.running.results import SCORECARD_VERSION, ScenarioResult, SuiteResult
from harness.scorecard.render.badge import render_badge
from harness.scorecard.render.coverage_tables import coverage_html
from harness.scorecard.render.htmlstyle import CSS
from harness.scorecard.render.microscope_section import microscope_section
from harness.scorecard.render.plots import render_plots
from harness.scorecard.render.soak_plots import soak_plots
from harness.scorecard.soak_figures import KIND_COLUMNS, is_soak, kind_rows, summary_rows
from harness.scorecard.step_series import StepSeries, load_series
from harness.scorecard.text import (
    CHECK_MARK,
    check_figure,
    clean_text,
    format_figure,
    format_number,
    format_score,
    format_seconds,
    plural,
    rerun_note,
    unique_slugs,
)


def _e(text: object) -> str:
    return escape(clean_text(str(text)))


def _bar(score: float) -> str:
    level = "" if score >= 90 else (" mid" if score >= 70 else " low")
    width = max(0.0, min(score, 100.0))
    return f'<span class="bar{level}"><span style="width:{width:.1f}%"></span></span>'


def _header(result: SuiteResult) -> str:
    counts = result.counts()
    meta = [f"preset <code>{_e(result.preset)}</code>"] if result.preset else []
    meta += [f"started {_e(result.started)}"] if result.started else []
    meta.append(
        f"{plural(len(result.scenarios), 'scenario')} in {_e(format_seconds(result.seconds))}"
    )
    meta += [f"from <code>{_e(result.source)}</code>"] if result.source else []
    verdict = "passed" if result.passed else "failed"
    threshold = ""
    if result.min_score is not None:
        met = "met" if result.score >= result.min_score else "not met"
        threshold = f" · minimum score {_e(format_number(result.min_score))} {met}"
    unjudged = sum(len(r.unjudged_checks) for r in result.scenarios)
    not_judged = (
        f'<li class="not-judged">{plural(unjudged, "check")} not judged</li>' if unjudged else ""
    )
    rows = "".join(
        f"<tr><td>{_e(name)}</td><td class='num'>{format_score(score)}</td>"
        f"<td>{_bar(score)}</td><td class='num'>"
        f"{sum(r.fault_class == name for r in result.scenarios)}</td></tr>"
        for name, score in result.class_scores().items()
    )
    return f"""<header class="summary">
<div><h1>tightrope scorecard: {_e(result.suite)}</h1>
<div class="meta">{" · ".join(meta)}</div>
<ul class="counts"><li class="passed">{counts["passed"]} passed</li>
<li class="failed">{counts["failed"]} failed</li><li class="error">{counts["error"]} error</li>
{not_judged}</ul>
<p class="verdict {verdict}">Suite {"passed" if result.passed else "did not pass"}{threshold}</p>
</div>
<div class="score-box" id="score"><span class="score-value">{format_score(result.score)}</span>
<span class="score-of">/ 100</span>{render_badge(result.score, id_prefix="page-badge")}</div>
<table class="classes" id="class-scores"><thead><tr><th>fault class</th>
<th class="num">score</th><th></th><th class="num">scenarios</th></tr></thead>
<tbody>{rows}</tbody></table>
</header>"""


def _index(result: SuiteResult, slugs: list[str]) -> str:
    rows = "".join(
        f"<tr><td><span class='pill {r.status}'>{r.status}</span></td>"
        f"<td><a href='#scenario-{s}'>{_e(r.name)}</a></td><td>{_e(r.fault_class)}</td>"
        f"<td class='num'>{_e(format_number(r.weight))}</td>"
        f"<td class='num'>{format_score(100 * r.score)}</td>"
        f"<td class='num'>{_e(format_seconds(r.seconds))}</td></tr>"
        for r, s in zip(result.scenarios, slugs, strict=True)
    )
    return (
        '<nav class="index"><h3>Scenarios</h3><table id="scenarios"><thead><tr><th>status</th>'
        "<th>scenario</th><th>fault class</th><th class='num'>weight</th>"
        "<th class='num'>score</th><th class='num'>time</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></nav>"
    )


def _checks(r: ScenarioResult) -> str:
    if not r.checks:
        return '<p class="note">No checks were judged.</p>'
    rows = []
    for c in r.checks:
        state = c.status
        extra = ", ".join(f"{k} = {format_figure(v)}" for k, v in c.figures.items())
        rows.append(
            f"<tr class='check-{state.replace(' ', '-')}'><td class='check-status'>"
            f"{CHECK_MARK[state]} {state}</td><td><code>{_e(c.name)}</code></td>"
            f"<td class='num'>{_e(check_figure(c))}</td><td>{_e(c.expected)}</td>"
            f"<td>{_e(c.detail)}<div class='extra'>{_e(extra)}</div></td></tr>"
        )
    return (
        "<table class='checks'><thead><tr><th>result</th><th>check</th>"
        "<th class='num'>figure</th><th>expected</th><th>detail</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _series(root: Path, rel: str | None, what: str) -> tuple[StepSeries | None, list[str]]:
    if not rel:
        return None, [f"no {what} run was recorded"]
    series, notes = load_series(root / rel)
    return series, [f"{what} run: {n}" for n in notes]


def _plots(r: ScenarioResult, root: Path, slug: str) -> str:
    faulted, notes = _series(root, r.run_dir, "faulted")
    baseline, base_notes = (
        (None, []) if r.baseline_dir is None else _series(root, r.baseline_dir, "baseline")
    )
    notes += base_notes
    figures = ""
    if faulted is not None:
        try:
            plots = render_plots(faulted, baseline, f"plot-{slug}")
        except Exception as exc:
            notes.append(f"plots could not be drawn: {type(exc).__name__}: {exc}")
        else:
            figures = "".join(
                f'<figure class="plot{" wide" if n == 0 else ""}" id="{p.id}">{p.svg}</figure>'
                for n, p in enumerate(plots)
            )
    note = "".join(f'<p class="note">{_e(n)}</p>' for n in notes)
    return f'<div class="plots">{figures}</div>{note}' if figures else note


def _soak(r: ScenarioResult, slug: str) -> str:
    """The soak's figures, its time to recover by kind, and its two plots."""
    facts = "".join(
        f"<tr><th>{_e(label)}</th><td>{_e(value)}</td></tr>"
        for label, value in summary_rows(r.metrics)
    )
    head = "".join(f"<th>{_e(c)}</th>" for c in KIND_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in kind_rows(r.metrics)
    )
    kinds = (
        f"<table class='checks'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        if body
        else ""
    )
    try:
        plots = soak_plots(r.metrics, f"soak-{slug}")
    except Exception as exc:
        return f"<table class='checks'>{facts}</table>{kinds}" + (
            f'<p class="note">soak plots could not be drawn: {_e(type(exc).__name__)}: '
            f"{_e(exc)}</p>"
        )
    figures = "".join(f'<figure class="plot wide" id="{p.id}">{p.svg}</figure>' for p in plots)
    return f"<table class='checks'>{facts}</table>{kinds}<div class='plots'>{figures}</div>"


def _scenario(r: ScenarioResult, root: Path, slug: str) -> str:
    facts = [
        ("fault class", r.fault_class),
        ("weight", format_number(r.weight)),
        ("score", f"{format_score(100 * r.score)} / 100"),
        ("time", format_seconds(r.seconds)),
        ("seed", str(r.seed)),
        ("exit code", "killed at its deadline" if r.exit_code is None else str(r.exit_code)),
    ]
    facts += [("run", r.run_dir)] if r.run_dir else []
    facts += [("baseline", r.baseline_dir)] if r.baseline_dir else []
    facts += [("ran on node", r.ran_on)] if r.ran_on else []
    note = rerun_note(r)
    facts += [("run again", note)] if note is not None else []
    dl = "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in facts)
    parts = [
        f'<section class="scenario {r.status}" id="scenario-{slug}">',
        f"<h2><span class='pill {r.status}'>{r.status}</span>{_e(r.name)}</h2>",
        f'<p class="description">{_e(r.description)}</p>' if r.description else "",
        f'<dl class="facts">{dl}</dl>',
        f'<div class="error-box">{_e(r.error)}</div>' if r.error is not None else "",
        _checks(r),
        _soak(r, slug) if is_soak(r.metrics) else "",
        _plots(r, root, slug),
        microscope_section(r, root, slug),
    ]
    if r.log_tail.strip():
        opened = " open" if r.status == "error" else ""
        parts.append(
            f"<details{opened}><summary>log tail</summary><pre>{_e(r.log_tail)}</pre></details>"
        )
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def render_html(result: SuiteResult, journal_root: Path) -> str:
    """The page; run directories in ``result`` are read relative to ``journal_root``."""
    slugs = unique_slugs([r.name for r in result.scenarios])
    sections = "\n".join(
        _scenario(r, journal_root, s) for r, s in zip(result.scenarios, slugs, strict=True)
    )
    version = f"tightrope {_e(result.version)} · " if result.version else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tightrope scorecard: {_e(result.suite)} ({format_score(result.score)})</title>
<style>{CSS}</style></head>
<body><div class="page">
{_header(result)}
{_index(result, slugs)}
{coverage_html(result, journal_root)}
<main>
{sections}
</main>
<footer>{version}scorecard version {SCORECARD_VERSION} · loss, loss scale and gradient norm
from each run's rank-0 journal, in the order written; red: fault injected, orange: detected,
green: recovered or restarted.</footer>
</div></body></html>
"""
