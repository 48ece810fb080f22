"""The oracles: one small class per check of a scenario's ``expect:``, judging a run's evidence.

Each is keyed by its name under ``expect:``, is built from that key's value
(`ExpectOracle.from_expect`) and turns `Evidence` into one `Check`. Verdicts rest on what
the agent observed and on the files the run left; the trainer's own claims (``detected``,
``recovered``) are counted where a check is about them, never as proof of health.
"""

from __future__ import annotations

from harness.oracles.base import ExpectOracle
from harness.oracles.checkpoints import NoCorruptCheckpointLoadedOracle
from harness.oracles.collapse import PhraseCollapseOracle
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
from harness.suites.scenario import Expect

__all__ = [
    "ORACLES",
    "CompletedOracle",
    "ContaminationOracle",
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
    "StallOracle",
    "ToxicOracle",
    "build_oracles",
    "judge",
]

#: Every oracle by the ``expect:`` key it checks.
ORACLES: dict[str, type[ExpectOracle]] = {
    cls.name: cls
    for cls in (
        DetectedOracle,
        ParamsFiniteOracle,
        CompletedOracle,
        FinalLossOracle,
        LostStepsOracle,
        MttrOracle,
        NoCorruptCheckpointLoadedOracle,
        ContaminationOracle,
        FalseAlarmsOracle,
        LossScaleRecoveredOracle,
        FallbackRateOracle,
        ToxicOracle,
        ReplicasConsistentOracle,
        PhraseCollapseOracle,
        KeptParamsFiniteOracle,
        StallOracle,
        ProcessesLeftOracle,
    )
}


def build_oracles(expect: Expect) -> list[Oracle]:
    """The oracles of the checks ``expect`` asks for, in the order of its fields."""
    return [ORACLES[name].from_expect(getattr(expect, name)) for name in expect.checks()]


def judge(expect: Expect, evidence: Evidence) -> list[Check]:
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
