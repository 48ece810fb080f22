"""A suite's results as a terminal table: what passed, what failed and by how much."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from harness.results import SuiteResult
from harness.verdict import Check

_STATUS = {"passed": "[green]PASS[/]", "failed": "[red]FAIL[/]", "error": "[magenta]ERROR[/]"}


def describe_check(check: Check) -> str:
    """``detected: 3 steps (expected <= 1 steps)`` with the figure and its unit."""
    unit = f" {check.unit}" if check.unit and check.figure is not None else ""
    return f"{check.name}: {check.figure}{unit} (expected {check.expected})"


def print_results(result: SuiteResult, console: Console) -> None:
    """One row per scenario, the failed checks with figures, then the scores."""
    table = Table(title=f"{result.suite} · preset {result.preset}", title_justify="left")
    for column in ("scenario", "class", "status", "score", "time", "failed checks / error"):
        table.add_column(column, no_wrap=column in ("scenario", "status"))
    for r in result.scenarios:
        why = (
            r.error.splitlines()[0] if r.error else "; ".join(map(describe_check, r.failed_checks))
        )
        table.add_row(
            r.name,
            r.fault_class,
            _STATUS[r.status],
            f"{r.score * 100:.0f}",
            f"{r.seconds:.1f}s",
            why,
        )
    console.print(table)
    classes = "  ".join(f"{c} {s:.1f}" for c, s in result.class_scores().items())
    counts = result.counts()
    console.print(
        f"resilience score [bold]{result.score:.1f}[/] / 100   ({classes})   "
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} errored",
        highlight=False,
    )
