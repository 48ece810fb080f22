"""The coverage section of scorecard.md and scorecard.html: per fault kind, the mechanisms
it met and did not, and the monitoring checklist's counts."""

from __future__ import annotations

from html import escape
from pathlib import Path

from harness.running.results import SuiteResult
from harness.scorecard.coverage import COLUMNS, COLUMNS_DOC, Coverage, coverage


def _counts_line(cov: Coverage) -> str:
    emitted = (
        f"{cov.emitted} emitted by its {cov.runs_read} run(s) read, "
        f"{cov.exercised_emitted} of them among those exercised"
        if cov.emitted is not None
        else "emitted: runs not read"
    )
    return (
        f"Monitoring checklist: {cov.exercised} of {cov.items} items exercised by the suite's "
        f"fault kinds; {emitted} (`tightrope checklist`, docs/checklist.md)."
    )


def coverage_markdown(result: SuiteResult, journal_root: Path | None = None) -> list[str]:
    """scorecard.md's coverage section: per fault kind, the mechanisms it met and did not."""
    cov = coverage(result, journal_root)
    lines = ["### Coverage", "", _counts_line(cov)]
    if cov.rows:
        lines += [
            "",
            "| fault kind | scenarios | mechanisms on | never on with it | unknown |",
            "|---|---:|---:|---|---:|",
        ]
        for row in cov.rows:
            never = [m for m in COLUMNS if not row.on.get(m)]
            known = row.scenarios - row.unknown
            never_text = ", ".join(never) if known else "-"
            lines.append(
                f"| {row.kind} | {row.scenarios} | {sum(1 for m in COLUMNS if row.on.get(m))} "
                f"of {len(COLUMNS)} | {never_text} | {row.unknown} |"
            )
    if cov.notes:
        lines += ["", *(f"_{note}_" for note in cov.notes)]
    return lines


def coverage_html(result: SuiteResult, journal_root: Path | None = None) -> str:
    """scorecard.html's coverage section: fault kinds x mechanisms, scenarios per cell."""
    cov = coverage(result, journal_root)
    head = "".join(
        f"<th class='num' title='{escape(COLUMNS_DOC.get(m, ''))}' "
        f"style='writing-mode:vertical-rl;transform:rotate(180deg)'>{escape(m)}</th>"
        for m in COLUMNS
    )
    body = []
    for row in cov.rows:
        cells = "".join(
            f"<td class='num'>{row.on[m]}</td>" if row.on.get(m) else "<td class='num'>·</td>"
            for m in COLUMNS
        )
        body.append(
            f"<tr><td><code>{escape(row.kind)}</code></td><td class='num'>{row.scenarios}</td>"
            f"{cells}<td class='num'>{row.unknown}</td></tr>"
        )
    table = (
        "<table class='checks' id='coverage-table'><thead><tr><th>fault kind</th>"
        f"<th class='num'>scenarios</th>{head}<th class='num'>unknown</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
        if body
        else "<p class='note'>No scenario's faults could be read.</p>"
    )
    notes = "".join(f"<p class='note'>{escape(n)}</p>" for n in cov.notes)
    counts = escape(_counts_line(cov).replace("`", ""))
    return (
        '<section class="coverage" id="coverage" style="margin-top:1.5em">'
        "<h2>Coverage: fault kinds × mechanisms</h2>"
        f"<p id='checklist-counts'>{counts}</p>"
        "<p class='note'>Each cell: scenarios that injected the fault kind with the mechanism "
        "on (·: never).</p>"
        f"<div style='overflow-x:auto'>{table}</div>{notes}</section>"
    )
