"""A suite's results in the terminal: a table of scenarios, then what failed and by how much."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from harness.running.results import ScenarioResult, SuiteResult
from harness.scorecard.soak_figures import KIND_COLUMNS, is_soak, kind_rows, summary_rows
from harness.scorecard.text import describe_check, rerun_note
from harness.tables import Cell, Column, print_table

_STATUS = {"passed": "[green]PASS[/]", "failed": "[red]FAIL[/]", "error": "[magenta]ERROR[/]"}
_ERROR_CHARS = 300


def print_results(result: SuiteResult, console: Console) -> None:
    """One row per scenario, the failed and not-judged checks with their figures, then the
    scores."""
    rows: list[list[Cell]] = []
    for r in result.scenarios:
        passed = sum(c.status == "passed" for c in r.checks)
        unjudged = len(r.unjudged_checks)
        rows.append(
            [
                r.name,
                r.fault_class,
                Text.from_markup(_STATUS[r.status]),
                f"{r.score * 100:.0f}",
                f"{passed}/{len(r.checks)}" + (f" ({unjudged} not judged)" if unjudged else ""),
                f"{r.seconds:.1f}s",
            ]
        )
    right = Column("score", justify="right"), Column("time", justify="right")
    columns: list[Column | str] = ["scenario", "class", "status", right[0], "checks", right[1]]
    print_table(console, f"{result.suite} · preset {result.preset}", columns, rows)
    for r in result.scenarios:
        if is_soak(r.metrics):
            print_soak(r, console)
    for r in result.scenarios:
        note = rerun_note(r)
        if note is not None:
            console.print(f"[yellow]RERUN[/] [bold]{escape(r.name)}[/]: {escape(note)}")
    for r in result.scenarios:
        if r.status == "passed":
            continue
        console.print(f"{_STATUS[r.status]} [bold]{escape(r.name)}[/]")
        if r.error:
            error = " ".join(r.error.split())
            cut = error[:_ERROR_CHARS] + (" ..." if len(error) > _ERROR_CHARS else "")
            console.print(f"    error: {escape(cut)}", highlight=False)
        for c in r.failed_checks:
            console.print(f"    {escape(describe_check(c, detail=True))}", highlight=False)
    classes = "  ".join(f"{c} {s:.1f}" for c, s in result.class_scores().items())
    counts = result.counts()
    console.print(
        f"resilience score [bold]{result.score:.1f}[/] / 100  ({classes})\n"
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} errored",
        highlight=False,
    )


def print_soak(r: ScenarioResult, console: Console) -> None:
    """A soak's figures: ETTR, goodput, steps lost, faults; time to recover by kind."""
    console.print(f"[bold]{escape(r.name)}[/]")
    for label, value in summary_rows(r.metrics):
        console.print(f"    {label:<11} {escape(value)}", highlight=False)
    rows = kind_rows(r.metrics)
    if rows:
        columns = [Column(c, justify="left" if c == "kind" else "right") for c in KIND_COLUMNS]
        print_table(console, "time to recover by fault kind", columns, [list(r) for r in rows])
