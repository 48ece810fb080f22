"""Two scorecards' comparison as text for a terminal, its tables also valid Markdown."""

from __future__ import annotations

from harness.scorecard.compare import CheckChange, Comparison, ScenarioChange
from harness.scorecard.text import NOT_JUDGED, format_figure, format_score


def _signed(delta: float) -> str:
    return f"{delta:+.1f}" if abs(delta) >= 0.05 else "±0.0"


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """A Markdown pipe table, padded so it also reads as plain text in a terminal."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if i in right else "-" * (w + 2) for i, w in enumerate(widths)
        )
        + "|"
    )
    return [line(header), rule, *(line(r) for r in rows)]


def _score(value: float | None) -> str:
    return "—" if value is None else format_score(value)


def _scenario_rows(changes: list[ScenarioChange]) -> list[str]:
    rows = [
        [
            c.name,
            c.fault_class,
            # No status icons here: emoji are two columns wide and would skew the padding.
            f"{c.old_status} -> {c.new_status}",
            f"{format_score(100 * c.old_score)} -> {format_score(100 * c.new_score)}",
        ]
        for c in changes
    ]
    return _table(["scenario", "fault class", "status", "score"], rows, {3})


def _check_rows(changes: list[CheckChange], labels: tuple[str, str]) -> list[str]:
    rows = [
        [
            c.scenario,
            c.check,
            format_figure(c.old_figure, c.unit) if c.old_judged else NOT_JUDGED,
            format_figure(c.new_figure, c.unit) if c.new_judged else NOT_JUDGED,
            c.expected,
        ]
        for c in changes
    ]
    heads = [f"{labels[0]} figure", f"{labels[1]} figure"]
    return _table(["scenario", "check", *heads, "expected"], rows, {2, 3})


def render_comparison(c: Comparison) -> str:
    """The comparison as text for a terminal (its tables are also valid Markdown)."""
    title = c.new_suite if c.same_suite else f"{c.old_suite} -> {c.new_suite}"
    lines = [
        f"tightrope compare: {title}",
        f"resilience score {format_score(c.old_score)} -> {format_score(c.new_score)} "
        f"({_signed(c.delta)})",
    ]
    if not c.same_suite:
        lines.append(
            f"note: different suites ({c.old_suite!r} and {c.new_suite!r}); scenarios are "
            "matched by name"
        )
    rows = [
        [name, _score(o), _score(n), "" if o is None or n is None else _signed(n - o)]
        for name, (o, n) in c.class_scores.items()
    ]
    lines += ["", *_table(["fault class", *c.labels, "delta"], rows, {1, 2, 3})]
    sections: list[tuple[str, list[str]]] = [
        (f"Regressed scenarios ({len(c.regressions)})", _scenario_rows(c.regressions)),
        (f"Checks that now fail ({len(c.broken_checks)})", _check_rows(c.broken_checks, c.labels)),
        (f"Improved scenarios ({len(c.improvements)})", _scenario_rows(c.improvements)),
        (f"Checks that now pass ({len(c.fixed_checks)})", _check_rows(c.fixed_checks, c.labels)),
    ]
    for heading, table in sections:
        if len(table) > 2:
            lines += ["", heading, *table]
    if c.added:
        lines += ["", f"Added (not compared): {', '.join(c.added)}"]
    if c.removed:
        lines += ["", f"Removed: {', '.join(c.removed)}"]
    verdict = "REGRESSED" if c.regressed else "no regressions"
    lines += ["", f"verdict: {verdict}"]
    return "\n".join(lines) + "\n"
