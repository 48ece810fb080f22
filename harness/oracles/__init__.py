"""The oracles: one small class per check of a scenario's ``expect:``, judging a run's evidence.

Each is keyed by its name under ``expect:``, declares what that key takes (its
`Expectation`), is built from the key's value (`ExpectOracle.from_expect`) and turns
`Evidence` into one `Check`. Declaring the class registers the check: `ORACLES` is read
from the declarations, and so are the scenario model's ``expect`` and the docs' table.
Verdicts rest on what the agent observed and on the files the run left; the trainer's own
claims (``detected``, ``recovered``) are counted where a check is about them, never as
proof of health.
"""

from __future__ import annotations

from typing import Protocol

from harness.oracles.base import ExpectOracle, registered
from harness.oracles.checkpoints import NoCorruptCheckpointLoadedOracle
from harness.oracles.collapse import PhraseCollapseOracle
from harness.oracles.culprit import CulpritOracle, SlowdownOracle
from harness.oracles.data import ContaminationOracle, ToxicOracle
from harness.oracles.detection import DetectedOracle, FalseAlarmsOracle
from harness.oracles.fallback import FallbackRateOracle
from harness.oracles.health import (
    CompletedOracle,
    FinalLossOracle,
    KeptParamsFiniteOracle,
    LossScaleRecoveredOracle,
    ParamsFiniteOracle,
)
from harness.oracles.processes import ProcessesLeftOracle
from harness.oracles.recovery import LostStepsOracle, MttrOracle
from harness.oracles.replicas import ReplicasConsistentOracle
from harness.oracles.stall import StallOracle
from harness.oracles.verdict import Check, Evidence, Oracle

__all__ = [
    "ORACLES",
    "CompletedOracle",
    "ContaminationOracle",
    "CulpritOracle",
    "DetectedOracle",
    "ExpectOracle",
    "FallbackRateOracle",
    "FalseAlarmsOracle",
    "FinalLossOracle",
    "KeptParamsFiniteOracle",
    "LossScaleRecoveredOracle",
    "LostStepsOracle",
    "MttrOracle",
    "NoCorruptCheckpointLoadedOracle",
    "ParamsFiniteOracle",
    "PhraseCollapseOracle",
    "ProcessesLeftOracle",
    "ReplicasConsistentOracle",
    "SlowdownOracle",
    "StallOracle",
    "ToxicOracle",
    "build_oracles",
    "judge",
]

#: Every oracle by the ``expect:`` key it checks, in the order of their expectations.
ORACLES: dict[str, type[ExpectOracle]] = registered()


class Asked(Protocol):
    """A scenario's ``expect:`` (`harness.suites.scenario.Expect`): a field per check."""

    def checks(self) -> list[str]:
        """Names of the checks asked for."""
        ...


def build_oracles(expect: Asked) -> list[Oracle]:
    """The oracles of the checks ``expect`` asks for, in the order of its fields."""
    return [ORACLES[name].from_expect(getattr(expect, name)) for name in expect.checks()]


def judge(expect: Asked, evidence: Evidence) -> list[Check]:
    """Every asked-for check's verdict on ``evidence``, in the order of ``expect``'s fields."""
    checks = []
    for oracle in build_oracles(expect):
        try:
            checks.append(oracle.judge(evidence))
        except Exception as exc:
            # One oracle's bug must not cost the scenario its other verdicts; it fails
            # loudly in its own check instead.
            checks.append(
                Check(
                    name=oracle.name,
                    passed=False,
                    figure=None,
                    unit="",
                    expected="",
                    detail=f"the oracle failed: {type(exc).__name__}: {exc}",
                )
            )
    return checks
