"""Two scorecards side by side: what regressed, what improved, what came and went
(rendered by `harness.scorecard.render.comparison`).

Scenarios are matched by name, checks within a scenario by name, so scorecards of
different suites can still be compared where their scenarios overlap. A scenario only
one side has is listed as added or removed and never counts as a regression.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.oracles.verdict import Check, Figure
from harness.running.results import ScenarioResult, Status, SuiteResult

# Worse to better; a move down this list is a regression whatever the score did.
_RANK: dict[Status, int] = {"error": 0, "failed": 1, "passed": 2}
# Scores are shares of a few checks; differences below this are float noise.
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ScenarioChange:
    """A scenario whose status or score moved between the two scorecards."""

    name: str
    fault_class: str
    old_status: Status
    new_status: Status
    #: Scenario scores, 0 to 1.
    old_score: float
    new_score: float


@dataclass(frozen=True, slots=True)
class CheckChange:
    """A check that went from pass to fail (or back), with both figures."""

    scenario: str
    check: str
    old_figure: Figure
    new_figure: Figure
    unit: str
    #: The threshold, as the new scorecard states it.
    expected: str
    detail: str
    #: False for a side where the check was not judged (no evidence; scored as failed).
    old_judged: bool = True
    new_judged: bool = True


@dataclass(slots=True)
class Comparison:
    """What changed from ``old`` to ``new``."""

    old_suite: str
    new_suite: str
    old_score: float
    new_score: float
    #: Fault class -> (old, new) resilience score; None where a side has no such class.
    class_scores: dict[str, tuple[float | None, float | None]]
    #: Column names of the two sides: their presets when those differ, else old and new.
    labels: tuple[str, str] = ("old", "new")
    regressions: list[ScenarioChange] = field(default_factory=list)
    improvements: list[ScenarioChange] = field(default_factory=list)
    broken_checks: list[CheckChange] = field(default_factory=list)
    fixed_checks: list[CheckChange] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def delta(self) -> float:
        """New overall score minus old."""
        return self.new_score - self.old_score

    @property
    def same_suite(self) -> bool:
        """Both scorecards come from a suite of the same name."""
        return self.old_suite == self.new_suite

    @property
    def regressed(self) -> bool:
        """Some scenario in both got worse, or some check in both went from pass to fail."""
        return bool(self.regressions or self.broken_checks)


def _check_changes(
    old: ScenarioResult, new: ScenarioResult
) -> tuple[list[CheckChange], list[CheckChange]]:
    old_checks: dict[str, Check] = {}
    for c in old.checks:
        old_checks.setdefault(c.name, c)
    broken: list[CheckChange] = []
    fixed: list[CheckChange] = []
    for c in new.checks:
        before = old_checks.get(c.name)
        if before is None or before.passed == c.passed:
            continue
        change = CheckChange(
            new.name,
            c.name,
            before.figure,
            c.figure,
            c.unit or before.unit,
            c.expected,
            c.detail,
            old_judged=before.judged,
            new_judged=c.judged,
        )
        (fixed if c.passed else broken).append(change)
    return broken, fixed


def compare(old: SuiteResult, new: SuiteResult) -> Comparison:
    """What regressed and improved from ``old`` to ``new``, scenario by scenario."""
    old_classes, new_classes = old.class_scores(), new.class_scores()
    classes = list(dict.fromkeys([*old_classes, *new_classes]))
    result = Comparison(
        old_suite=old.suite,
        new_suite=new.suite,
        old_score=old.score,
        new_score=new.score,
        class_scores={c: (old_classes.get(c), new_classes.get(c)) for c in classes},
        labels=(old.preset, new.preset) if old.preset != new.preset else ("old", "new"),
    )
    before = {r.name: r for r in old.scenarios}
    names_now = {r.name for r in new.scenarios}
    result.removed = [r.name for r in old.scenarios if r.name not in names_now]
    for r in new.scenarios:
        was = before.get(r.name)
        if was is None:
            result.added.append(r.name)
            continue
        change = ScenarioChange(r.name, r.fault_class, was.status, r.status, was.score, r.score)
        rank_moved = _RANK[r.status] - _RANK[was.status]
        if rank_moved < 0 or (rank_moved == 0 and r.score < was.score - _EPS):
            result.regressions.append(change)
        elif rank_moved > 0 or r.score > was.score + _EPS:
            result.improvements.append(change)
        broken, fixed = _check_changes(was, r)
        result.broken_checks += broken
        result.fixed_checks += fixed
    return result
