"""A soak's figures as rows of text, shared by the terminal, Markdown and HTML reports.

A result carries them in ``metrics`` (``kind: soak``; written by `harness.soak.soak`,
fields in docs/soak.md); every report shows the same rows in the same words.
"""

from __future__ import annotations

from typing import Any

from harness.scorecard.text import format_seconds

KIND_COLUMNS = (
    "kind",
    "faults",
    "detected",
    "missed",
    "latent",
    "unrecovered",
    "MTTR median",
    "p90",
    "max",
)


def is_soak(metrics: dict[str, Any]) -> bool:
    """True for the metrics of a soak run."""
    return metrics.get("kind") == "soak" and "ettr" in metrics


def _share(value: Any) -> str:
    return f"{100 * float(value):.1f}%" if isinstance(value, int | float) else "-"


def _secs(value: Any) -> str:
    return format_seconds(float(value)) if isinstance(value, int | float) else "-"


def summary_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows: ETTR, goodput, steps lost, faults and their outcomes."""
    base = metrics.get("baseline") or {}
    unit = metrics.get("goodput_unit", "tokens/s")
    ratio = metrics.get("goodput_ratio")
    skipped = metrics.get("skipped_faults") or {}
    rows = [
        ("steps", f"{metrics.get('kept_steps', 0):,} kept of {metrics.get('steps', 0):,}"),
        ("wall time", _secs(metrics.get("wall_seconds"))),
        (
            "ETTR",
            _share(metrics.get("ettr"))
            + (f" (fault-free run: {_share(base['ettr'])})" if "ettr" in base else ""),
        ),
        (
            "goodput",
            f"{float(metrics.get('goodput', 0)):,.0f} {unit}"
            + (f" ({ratio:.2f} of the fault-free run's)" if isinstance(ratio, float) else ""),
        ),
        ("steps lost", f"{metrics.get('steps_lost', 0):,} (trained again or skipped)"),
        (
            "faults",
            f"{metrics.get('faults', 0)} injected of {metrics.get('planned_faults', 0)} planned: "
            f"{metrics.get('detected', 0)} detected, {metrics.get('missed', 0)} missed, "
            f"{metrics.get('latent', 0)} latent"
            + (f"; {sum(skipped.values())} found nothing to act on" if skipped else ""),
        ),
        ("seed", f"{metrics.get('seed')} (rate {metrics.get('rate')} faults a step)"),
    ]
    return rows


def kind_rows(metrics: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per fault kind, in `KIND_COLUMNS` order."""
    rows: list[tuple[str, ...]] = []
    for kind, row in sorted((metrics.get("by_kind") or {}).items()):
        rows.append(
            (
                kind,
                str(row.get("faults", 0)),
                str(row.get("detected", 0)),
                str(row.get("missed", 0)),
                str(row.get("latent", 0)),
                str(row.get("unrecovered", 0)),
                _secs(row.get("median")),
                _secs(row.get("p90")),
                _secs(row.get("max")),
            )
        )
    return rows
