"""scorecard.md: GitHub-flavoured Markdown, short enough for a CI job summary."""

from __future__ import annotations

import re
from pathlib import Path

from harness.running.results import ScenarioResult, SuiteResult
from harness.scorecard.render.coverage_tables import coverage_markdown
from harness.scorecard.soak_figures import KIND_COLUMNS, is_soak, kind_rows, summary_rows
from harness.scorecard.text import (
    NOT_JUDGED,
    STATUS_ICON,
    check_figure,
    clean_text,
    format_number,
    format_score,
    format_seconds,
    plural,
    rerun_note,
)

# "<=" in an expectation is text, but "<details" in a log line would open an element.
_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")
_BACKTICKS = re.compile(r"`+")


def _cell(text: str) -> str:
    """Text safe inside a table cell: one line, no column breaks, no stray HTML tags."""
    text = _TAG_START.sub("&lt;", clean_text(text))
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _code(text: str) -> str:
    """Inline code that survives backticks inside it."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {text} {fence}" if longest else f"`{text}`"


def _block(text: str) -> list[str]:
    """A fenced code block, its fence longer than any run of backticks in the text."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, clean_text(text).rstrip("\n"), fence]


def _header(result: SuiteResult) -> list[str]:
    counts = result.counts()
    preset = f" · preset `{result.preset}`" if result.preset else ""
    verdict = "passed" if result.passed else "did not pass"
    if result.interrupted:
        verdict = "was interrupted: this scorecard is partial"
    lines = [
        f"## tightrope scorecard: {_cell(result.suite)}{preset}",
        "",
        f"Resilience score **{format_score(result.score)} / 100** · suite {verdict}",
        "",
        f"{STATUS_ICON['passed']} {counts['passed']} passed · "
        f"{STATUS_ICON['failed']} {counts['failed']} failed · "
        f"{STATUS_ICON['error']} {counts['error']} error · "
        f"{plural(len(result.scenarios), 'scenario')} in {format_seconds(result.seconds)}",
    ]
    unjudged = sum(len(r.unjudged_checks) for r in result.scenarios)
    if unjudged:
        lines += ["", f"{plural(unjudged, 'check')} {NOT_JUDGED} (no evidence; scored as failed)"]
    if result.min_score is not None:
        met = "met" if result.score >= result.min_score else "**not met**"
        lines += ["", f"Minimum score {format_number(result.min_score)}: {met}"]
    return lines


def _class_table(result: SuiteResult) -> list[str]:
    lines = ["| fault class | score | scenarios | passed |", "|---|---:|---:|---:|"]
    for fault_class, score in result.class_scores().items():
        members = [r for r in result.scenarios if r.fault_class == fault_class]
        passed = sum(r.status == "passed" for r in members)
        lines.append(
            f"| {_cell(fault_class)} | {format_score(score)} | {len(members)} | {passed} |"
        )
    return lines


def _scenario_table(result: SuiteResult) -> list[str]:
    lines = [
        "| status | scenario | fault class | weight | score | time |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in result.scenarios:
        lines.append(
            f"| {STATUS_ICON[r.status]} {r.status} | {_cell(r.name)} | {_cell(r.fault_class)} | "
            f"{format_number(r.weight)} | {format_score(100 * r.score)} | "
            f"{format_seconds(r.seconds)} |"
        )
    return lines


def _reruns(result: SuiteResult) -> list[str]:
    """The scenarios a cluster ran again after losing a node (docs/cluster.md)."""
    notes = [(r.name, rerun_note(r)) for r in result.scenarios]
    return [f"- {_code(name)}: {_cell(note)}" for name, note in notes if note is not None]


def _check_table(r: ScenarioResult) -> list[str]:
    lines = ["| check | figure | expected | detail |", "|---|---:|---|---|"]
    for c in r.failed_checks:
        lines.append(
            f"| {_cell(c.name)} | {_cell(check_figure(c))} | "
            f"{_cell(c.expected)} | {_cell(c.detail)} |"
        )
    passed = len(r.checks) - len(r.failed_checks)
    tally = f"{passed} of {len(r.checks)} checks passed"
    unjudged = len(r.unjudged_checks)
    if unjudged:
        tally += f"; {unjudged} {NOT_JUDGED}, counted as failed"
    return [*lines, "", f"{tally}."]


def _failed(r: ScenarioResult) -> list[str]:
    lines = [f"### {STATUS_ICON['failed']} {_code(r.name)} failed ({_cell(r.fault_class)})", ""]
    if r.description:
        lines += [_cell(r.description), ""]
    lines += _check_table(r)
    if r.log_tail.strip():
        lines += ["", "<details><summary>log tail</summary>", "", *_block(r.log_tail), "</details>"]
    return lines


def _errored(r: ScenarioResult) -> list[str]:
    lines = [f"### {STATUS_ICON['error']} {_code(r.name)} errored ({_cell(r.fault_class)})", ""]
    exit_code = "killed at its deadline" if r.exit_code is None else f"exit code {r.exit_code}"
    lines += [f"**Error:** {_cell(r.error or '')} ({exit_code})", ""]
    # An errored run's checks are still judged; the failed (and the not-judged) ones often
    # say where it broke.
    if r.failed_checks:
        lines += [*_check_table(r), ""]
    tail = r.log_tail if r.log_tail.strip() else "(the run left no log)"
    lines += ["<details open><summary>log tail</summary>", "", *_block(tail), "</details>"]
    return lines


def _soak(r: ScenarioResult) -> list[str]:
    lines = [f"### Soak {_code(r.name)}", "", "| figure | value |", "|---|---|"]
    lines += [f"| {label} | {_cell(value)} |" for label, value in summary_rows(r.metrics)]
    rows = kind_rows(r.metrics)
    if rows:
        lines += ["", "| " + " | ".join(KIND_COLUMNS) + " |"]
        lines += ["|" + "---|" * len(KIND_COLUMNS)]
        lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def render_markdown(result: SuiteResult, journal_root: Path | None = None) -> str:
    """scorecard.md's text: score, counts, per-class and per-scenario tables, coverage, then
    failures (run directories, for the checklist's counts, are read under ``journal_root``)."""
    lines = _header(result)
    lines += ["", "### Fault classes", "", *_class_table(result)]
    lines += ["", "### Scenarios", "", *_scenario_table(result)]
    reruns = _reruns(result)
    if reruns:
        lines += ["", "### Run again after a lost cluster node", "", *reruns]
    lines += ["", *coverage_markdown(result, journal_root)]
    for r in result.scenarios:
        if is_soak(r.metrics):
            lines += ["", *_soak(r)]
    for r in result.scenarios:
        if r.status == "failed":
            lines += ["", *_failed(r)]
        elif r.status == "error":
            lines += ["", *_errored(r)]
    return "\n".join(lines) + "\n"
