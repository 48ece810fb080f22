"""Results and scoring: a scenario's checks make its score; weighted scores make the suite's.

A scenario's score is the share of its checks that passed (0 to 1); a check that was not
judged (no evidence either way) counts as failed, and an errored run (a crash, a timeout,
a trainer that could not start) scores 0 whatever its checks say. The
resilience score of a suite, overall or per fault class, is
``100 * sum(weight * score) / sum(weight)``: 0 to 100, never above.

These are also the contents of ``scorecard.json`` (`to_dict` / `from_dict`; the schema is
documented in `docs/scorecard.md` and versioned by `SCORECARD_VERSION`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.errors import TightropeError
from harness.oracles.verdict import Check

#: Bumped when a field of scorecard.json changes meaning or a required one is added.
SCORECARD_VERSION = 1

Status = Literal["passed", "failed", "error"]


class ScorecardError(TightropeError):
    """A scorecard could not be read or compared."""


@dataclass(slots=True)
class ScenarioResult:
    """What one scenario came to."""

    name: str
    fault_class: str
    weight: float
    checks: list[Check]
    #: "error" when the run could not be judged (crash before training, timeout, ...).
    error: str | None = None
    #: The last lines the trainer wrote, kept for errored and failed runs.
    log_tail: str = ""
    seconds: float = 0.0
    seed: int = 0
    #: Exit code of the trainer's (last) launch; None when the watchdog killed it.
    exit_code: int | None = 0
    #: Run directories, relative to the scorecard directory.
    run_dir: str = ""
    baseline_dir: str | None = None
    description: str = ""
    #: The scenario as validated (trainer, faults, expect), for reports and re-judging.
    spec: dict[str, Any] = field(default_factory=dict)
    #: Seconds the faulted run's launch took (its baseline and judging not included).
    run_seconds: float | None = None
    #: What only the launch saw, kept for judging again: processes of the run still
    #: alive after its launcher ended (None: not looked), and when it ended (epoch s).
    left_behind: int | None = None
    #: Those processes, one line each (pid, command line, what started it).
    left_processes: list[str] = field(default_factory=list)
    ended: float | None = None
    #: Figures beyond the checks (a soak's ETTR, goodput, incidents: docs/soak.md).
    metrics: dict[str, Any] = field(default_factory=dict)
    #: Attempts of this scenario's runs (faulted or baseline) that a cluster lost with its
    #: node and ran again on another, one line each (docs/cluster.md): the cluster's
    #: failures, never the trainer's; the checks judge the attempt that finished.
    lost_attempts: list[str] = field(default_factory=list)
    #: The cluster node the faulted run finished on (its Ray node id); None: this machine.
    ran_on: str | None = None

    @property
    def status(self) -> Status:
        """passed, failed (some check failed or was not judged) or error (the run could not
        be judged)."""
        if self.error is not None:
            return "error"
        return "passed" if all(c.status == "passed" for c in self.checks) else "failed"

    @property
    def score(self) -> float:
        """Share of checks passed, 0 to 1; not judged counts as failed; 0 when errored."""
        if self.error is not None or not self.checks:
            return 0.0
        return sum(c.status == "passed" for c in self.checks) / len(self.checks)

    @property
    def failed_checks(self) -> list[Check]:
        """The checks that did not pass, not judged ones included, in the order judged."""
        return [c for c in self.checks if c.status != "passed"]

    @property
    def unjudged_checks(self) -> list[Check]:
        """The checks that were not judged (no evidence), in the order judged."""
        return [c for c in self.checks if c.status == "not judged"]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for scorecard.json."""
        return {
            "name": self.name,
            "description": self.description,
            "fault_class": self.fault_class,
            "weight": self.weight,
            "status": self.status,
            "score": self.score,
            "seconds": self.seconds,
            "seed": self.seed,
            "exit_code": self.exit_code,
            "run_dir": self.run_dir,
            "baseline_dir": self.baseline_dir,
            "error": self.error,
            "log_tail": self.log_tail,
            "checks": [c.to_dict() for c in self.checks],
            "spec": self.spec,
            "run_seconds": self.run_seconds,
            "left_behind": self.left_behind,
            "left_processes": self.left_processes,
            "ended": self.ended,
            "metrics": self.metrics,
            "lost_attempts": self.lost_attempts,
            "ran_on": self.ran_on,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScenarioResult:
        """Read back what `to_dict` wrote (status and score are derived again)."""
        return cls(
            name=data["name"],
            fault_class=data["fault_class"],
            weight=float(data["weight"]),
            checks=[Check.from_dict(c) for c in data.get("checks", [])],
            error=data.get("error"),
            log_tail=data.get("log_tail", ""),
            seconds=float(data.get("seconds", 0.0)),
            seed=int(data.get("seed", 0)),
            exit_code=data.get("exit_code", 0),
            run_dir=data.get("run_dir", ""),
            baseline_dir=data.get("baseline_dir"),
            description=data.get("description", ""),
            spec=dict(data.get("spec", {})),
            run_seconds=data.get("run_seconds"),
            left_behind=data.get("left_behind"),
            left_processes=[str(p) for p in data.get("left_processes") or []],
            ended=data.get("ended"),
            metrics=dict(data.get("metrics") or {}),
            lost_attempts=[str(line) for line in data.get("lost_attempts") or []],
            ran_on=data.get("ran_on"),
        )


def resilience_score(results: Iterable[ScenarioResult]) -> float:
    """``100 * sum(weight * score) / sum(weight)``; 0 when there is nothing to score."""
    results = list(results)
    total = sum(r.weight for r in results)
    if total <= 0:
        return 0.0
    return min(100.0, 100.0 * sum(r.weight * r.score for r in results) / total)


@dataclass(slots=True)
class SuiteResult:
    """A whole suite's results: what the scorecards render."""

    suite: str
    preset: str
    scenarios: list[ScenarioResult]
    started: str = ""
    seconds: float = 0.0
    #: The score the run had to reach (None: only every scenario passing counts).
    min_score: float | None = None
    source: str = ""
    version: str = ""
    #: The run was stopped (Ctrl-C, SIGTERM) before every scenario ended: a partial card.
    interrupted: bool = False

    @property
    def score(self) -> float:
        """The overall resilience score, 0 to 100."""
        return resilience_score(self.scenarios)

    def class_scores(self) -> dict[str, float]:
        """Resilience score per fault class, in the order the classes first appear."""
        classes = list(dict.fromkeys(r.fault_class for r in self.scenarios))
        return {
            c: resilience_score(r for r in self.scenarios if r.fault_class == c) for c in classes
        }

    def counts(self) -> dict[str, int]:
        """How many scenarios passed, failed and errored."""
        out = {"passed": 0, "failed": 0, "error": 0}
        for r in self.scenarios:
            out[r.status] += 1
        return out

    @property
    def passed(self) -> bool:
        """Every scenario passed and the score meets the threshold (when one is set)."""
        if self.interrupted or any(r.status != "passed" for r in self.scenarios):
            return False
        return self.min_score is None or self.score >= self.min_score

    def to_dict(self) -> dict[str, Any]:
        """scorecard.json's contents."""
        return {
            "scorecard_version": SCORECARD_VERSION,
            "tightrope_version": self.version,
            "suite": self.suite,
            "source": self.source,
            "preset": self.preset,
            "started": self.started,
            "seconds": self.seconds,
            "score": self.score,
            "min_score": self.min_score,
            "passed": self.passed,
            "interrupted": self.interrupted,
            "counts": self.counts(),
            "class_scores": self.class_scores(),
            "scenarios": [r.to_dict() for r in self.scenarios],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "scorecard") -> SuiteResult:
        """Read scorecard.json's contents; a file of another kind or version is refused."""
        if not isinstance(data, dict) or "scorecard_version" not in data:
            raise ScorecardError(f"{where} is not a tightrope scorecard (no scorecard_version)")
        version = data["scorecard_version"]
        if not isinstance(version, int) or version > SCORECARD_VERSION:
            raise ScorecardError(
                f"{where} has scorecard_version {version!r}; this tightrope reads up to "
                f"{SCORECARD_VERSION}"
            )
        try:
            return cls(
                suite=str(data["suite"]),
                preset=str(data.get("preset", "")),
                scenarios=[ScenarioResult.from_dict(s) for s in data["scenarios"]],
                started=str(data.get("started", "")),
                seconds=float(data.get("seconds", 0.0)),
                min_score=data.get("min_score"),
                source=str(data.get("source", "")),
                version=str(data.get("tightrope_version", "")),
                interrupted=bool(data.get("interrupted", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ScorecardError(f"{where} is malformed: {type(exc).__name__}: {exc}") from None
