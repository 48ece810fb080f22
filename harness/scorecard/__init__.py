"""Scorecards: a suite's results and the views of them that every report draws from.

The JSON scorecard is the record (`jsonio`: `dumps_scorecard`, `load_scorecard`); `compare`
sets two of them side by side, `rejudge` (`report`) judges saved runs again, and `text`,
`coverage`, `step_series`, `soak_figures` and `microscope_figures` shape what the
renderers show. The renderers themselves (Markdown, JUnit XML, HTML, badge, terminal) and
`write_scorecards` live in `harness.scorecard.render`, which imports this room and is never
imported by it. The file formats are documented in `docs/scorecard.md`.
"""

from __future__ import annotations

from harness.running.results import ScorecardError
from harness.scorecard.compare import Comparison, compare
from harness.scorecard.jsonio import SCORECARD_JSON, dumps_scorecard, load_scorecard

__all__ = [
    "SCORECARD_JSON",
    "Comparison",
    "ScorecardError",
    "compare",
    "dumps_scorecard",
    "load_scorecard",
]
