"""The scorecard's renderers: JSON, Markdown, JUnit XML, an HTML page with its plots, a
badge, the terminal report and the comparison; the views they draw from live one room up,
in `harness.scorecard`.

`write_scorecards` writes the five files into one directory. The file formats are
documented in `docs/scorecard.md`.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.running.results import ScorecardError, SuiteResult
from harness.scorecard.jsonio import SCORECARD_JSON, dumps_scorecard
from harness.scorecard.render.badge import badge_color, render_badge
from harness.scorecard.render.comparison import render_comparison
from harness.scorecard.render.htmlpage import render_html
from harness.scorecard.render.junit import render_junit
from harness.scorecard.render.markdown import render_markdown

__all__ = [
    "FILES",
    "badge_color",
    "render_badge",
    "render_comparison",
    "render_html",
    "render_junit",
    "render_markdown",
    "write_scorecards",
]

#: Kind -> file name, in the order they are written.
FILES = {
    "json": SCORECARD_JSON,
    "markdown": "scorecard.md",
    "junit": "junit.xml",
    "html": "scorecard.html",
    "badge": "badge.svg",
}


def _write(path: Path, text: str) -> None:
    # Through a temporary file: a report re-rendered in place never leaves a reader
    # (a CI step, a browser) a half-written file.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_scorecards(
    result: SuiteResult, out_dir: Path, *, journal_root: Path | None = None
) -> dict[str, Path]:
    """Write the five scorecard files into ``out_dir``; returns kind -> path.

    Run directories in ``result`` are relative to ``journal_root``, by default ``out_dir``
    itself (where a suite run puts them).
    """
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScorecardError(f"cannot create scorecard directory {out_dir}: {exc}") from None
    texts = {
        "json": dumps_scorecard(result),
        "markdown": render_markdown(result, Path(journal_root or out_dir)),
        "junit": render_junit(result),
        "html": render_html(result, Path(journal_root or out_dir)),
        "badge": render_badge(result.score),
    }
    paths = {kind: out_dir / name for kind, name in FILES.items()}
    for kind, path in paths.items():
        try:
            _write(path, texts[kind])
        except OSError as exc:
            raise ScorecardError(f"cannot write {path}: {exc}") from None
    return paths
