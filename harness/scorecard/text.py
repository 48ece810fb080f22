"""Formatting shared by every scorecard: figures, scores, times, log text and anchors."""

from __future__ import annotations

import math
import re

from harness.oracles.verdict import Check, CheckStatus, Figure
from harness.running.results import ScenarioResult, Status

#: Icons for a scenario's status, in the Markdown summary and the comparison.
STATUS_ICON: dict[Status, str] = {"passed": "✅", "failed": "❌", "error": "💥"}
#: Marks for a check's status, on the HTML page.
CHECK_MARK: dict[CheckStatus, str] = {"passed": "✔", "failed": "✘", "not judged": "?"}
#: What stands for the figure of a check that was not judged.
NOT_JUDGED = "not judged"

# Colour codes and cursor moves that trainers and progress bars write into logs.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# Characters XML 1.0 cannot carry at all (JUnit and HTML are both read by XML parsers).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_SLUG = re.compile(r"[^a-z0-9]+")


def format_number(value: float) -> str:
    """A float shown short: integers without a point, others to four significant digits."""
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def format_figure(figure: Figure, unit: str = "") -> str:
    """A check's figure with its unit ("3 steps", "0.012 relative"); "—" when not measured."""
    if figure is None:
        return "—"
    if isinstance(figure, bool):
        text = str(figure).lower()
    elif isinstance(figure, (int, float)):
        text = format_number(float(figure)) if isinstance(figure, float) else str(figure)
    else:
        text = str(figure)
    return f"{text} {unit}" if unit else text


def raw_figure(figure: Figure) -> str:
    """A figure as a machine reads it (JUnit property values): no unit, full precision."""
    if figure is None:
        return ""
    if isinstance(figure, bool):
        return str(figure).lower()
    if isinstance(figure, float):
        return format_number(figure) if not math.isfinite(figure) else repr(figure)
    return str(figure)


def format_score(score: float) -> str:
    """A 0–100 resilience score to one decimal."""
    return f"{score:.1f}"


def format_seconds(seconds: float) -> str:
    """A duration a person reads: "0.4 s", "12 s", "3 min 05 s"."""
    if not math.isfinite(seconds) or seconds < 0:
        return "—"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def plural(n: int, word: str) -> str:
    """The count and the word, plural unless the count is 1 ("3 scenarios")."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def check_figure(check: Check) -> str:
    """A check's figure as a table shows it: "not judged" for a check with no evidence."""
    return format_figure(check.figure, check.unit) if check.judged else NOT_JUDGED


def describe_check(check: Check, *, detail: bool = False) -> str:
    """One line for a check that did not pass, the same in every report: name, figure against
    what was expected; a not-judged one starts "not judged:" and says why. With ``detail``, a
    judged one ends with its detail too (``params_finite: 3, expected true: 3 signs ...``)."""
    expected = f", expected {check.expected}" if check.expected else ""
    if not check.judged:
        return f"{NOT_JUDGED}: {check.name}{expected} ({check.detail})"
    line = f"{check.name}: {format_figure(check.figure, check.unit)}{expected}"
    return f"{line}: {check.detail}" if detail else line


def clean_text(text: str) -> str:
    """Log text fit for any report: colour codes and characters XML refuses removed."""
    return _NOT_XML.sub("", _ANSI.sub("", text))


def rerun_note(result: ScenarioResult) -> str | None:
    """What a cluster lost of a scenario's runs before the attempt judged, in one line
    (None when it lost nothing): the cluster's failure, never the trainer's."""
    if not result.lost_attempts:
        return None
    where = f" (finished on node {result.ran_on[:12]})" if result.ran_on else ""
    return (
        f"run again after the cluster lost {plural(len(result.lost_attempts), 'attempt')}"
        f"{where}, not the trainer's doing: " + "; ".join(result.lost_attempts)
    )


def slug(name: str) -> str:
    """An id-safe form of a scenario name ("NaN grad @15" -> "nan-grad-15")."""
    return _SLUG.sub("-", name.lower()).strip("-") or "scenario"


def unique_slugs(names: list[str]) -> list[str]:
    """`slug` of each name, numbered where two names would give the same one."""
    used: set[str] = set()
    out = []
    for name in names:
        base = candidate = slug(name)
        n = 1
        while candidate in used:
            n += 1
            candidate = f"{base}-{n}"
        used.add(candidate)
        out.append(candidate)
    return out
