"""The crash matrix on disk: ``crashpoints.json`` (docs/crashpoints.md), ``crashpoints.md``
(a row per point, grouped by the save it belongs to and its file event) and ``junit.xml``
(a test case per point; a verdict in ``--fail-on`` fails it)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.crashpoints.explore import PointResult
from harness.crashpoints.verdict import VERDICTS
from harness.scorecard.text import clean_text


@dataclass(slots=True)
class Matrix:
    """What an exploration found, and how to say it."""

    deterministic: bool
    wall_seconds: float
    results: list[PointResult]
    ranks: int
    #: How to run one point again: index -> a command line.
    reproduce: Callable[[int], str]
    points_total: int = 0
    file_events: dict[int, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, int]:
        """How many points got each verdict (every verdict named, zero or not)."""
        counts = dict.fromkeys(VERDICTS, 0)
        for r in self.results:
            counts[r.verdict] += 1
        return counts

    def failing(self, fail_on: Iterable[str]) -> list[PointResult]:
        """The points whose verdict is one of ``fail_on``."""
        bad = set(fail_on)
        return [r for r in self.results if r.verdict in bad]


def point_document(r: PointResult, reproduce: Callable[[int], str]) -> dict[str, Any]:
    """One point of crashpoints.json."""
    event = r.point.event.document()
    return {
        "index": r.point.index,
        "rank": r.point.rank,
        "mode": r.point.mode,
        "event": event,
        "verdict": r.verdict,
        "why": r.why,
        "evidence": r.outcome.document(),
        "seconds": round(r.seconds, 3),
        "cached": r.cached,
        "reproduce": reproduce(r.point.index),
    }


def document(m: Matrix) -> dict[str, Any]:
    """The whole of crashpoints.json (and of ``--json``)."""
    return {
        "deterministic": m.deterministic,
        "wall_seconds": round(m.wall_seconds, 3),
        "summary": m.summary(),
        "ranks": m.ranks,
        "file_events": {str(k): v for k, v in m.file_events.items()},
        "points_total": m.points_total,
        "points_explored": len(m.results),
        "notes": m.notes,
        "points": [point_document(r, m.reproduce) for r in m.results],
    }


def _save_name(step: int | None) -> str:
    return "start-up (before the first step)" if step is None else f"save after step {step}"


def _cell(value: object) -> str:
    return "–" if value is None else str(value).replace("|", "\\|")


def markdown(m: Matrix, fail_on: Iterable[str]) -> str:
    """crashpoints.md: the summary, then a table per save, a row per point."""
    s = m.summary()
    lines = [
        "# Crash points",
        "",
        " · ".join(f"{v} {s[v]}" for v in VERDICTS)
        + f" · {len(m.results)} of {m.points_total} points · {m.wall_seconds:.0f} s",
        "",
    ]
    if not m.deterministic:
        lines += [
            "**Not deterministic**: two fault-free runs ended with different parameters, "
            "so SILENT_DIVERGENCE verdicts mean nothing here.",
            "",
        ]
    lines += [f"- {note}" for note in m.notes] + ([""] if m.notes else [])
    groups: dict[int | None, list[PointResult]] = {}
    for r in m.results:
        groups.setdefault(r.point.event.save_step, []).append(r)
    rank_col = m.ranks > 1
    for step, rows in groups.items():
        lines += [f"## {_save_name(step)}", ""]
        head = ["#", *(["rank"] if rank_col else []), "event", "mode", "verdict"]
        head += ["newest complete", "resumed from", "why"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            o = r.outcome
            cells = [str(r.point.index), *([str(r.point.rank)] if rank_col else [])]
            cells += [f"`{r.point.event.n}` {r.point.event.describe()}", r.point.mode, r.verdict]
            cells += [_cell(o.newest_complete), _cell(o.resumed_from), r.why]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    bad = m.failing(fail_on)
    if bad:
        lines += ["## Reproduce", ""]
        lines += [f"- #{r.point.index} {r.verdict}: `{m.reproduce(r.point.index)}`" for r in bad]
        lines.append("")
    return "\n".join(lines)


def junit(m: Matrix, fail_on: Iterable[str]) -> str:
    """junit.xml: one test case per point."""
    bad = set(fail_on)
    suite = ET.Element(
        "testsuite",
        name="tightrope.crashpoints",
        tests=str(len(m.results)),
        failures=str(sum(r.verdict in bad for r in m.results)),
        time=f"{m.wall_seconds:.3f}",
    )
    for r in m.results:
        step = r.point.event.save_step
        case = ET.SubElement(
            suite,
            "testcase",
            classname=clean_text(f"tightrope.crashpoints.{'start-up' if step is None else step}"),
            name=clean_text(r.point.label(m.ranks)),
            time=f"{r.seconds:.3f}",
        )
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="verdict", value=r.verdict)
        if r.verdict in bad:
            failure = ET.SubElement(case, "failure", message=clean_text(r.why), type=r.verdict)
            failure.text = clean_text(
                f"{r.why}\nreproduce: {m.reproduce(r.point.index)}\n"
                + json.dumps(r.outcome.document(), indent=1)
            )
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def write_matrix(m: Matrix, out: Path, fail_on: Iterable[str]) -> list[Path]:
    """Write crashpoints.json, crashpoints.md and junit.xml into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    fail = list(fail_on)
    paths = [out / "crashpoints.json", out / "crashpoints.md", out / "junit.xml"]
    paths[0].write_text(json.dumps(document(m), indent=1) + "\n")
    paths[1].write_text(markdown(m, fail))
    paths[2].write_text(junit(m, fail))
    return paths
