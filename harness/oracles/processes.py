"""Nothing was left running: no process of the run outlived its launcher."""

from __future__ import annotations

from dataclasses import dataclass

from harness.oracles.base import ExpectOracle
from harness.oracles.expectation import Expectation
from harness.oracles.verdict import Check, Evidence


@dataclass(frozen=True)
class ProcessesLeftOracle(ExpectOracle):
    """Every process the launch started (each carries the launch's mark in its
    environment) had ended when the launcher did; the harness kills and counts the rest."""

    name = "no_processes_left"
    expectation = Expectation(
        type=bool,
        order=17,
        passes_when="no process of the launch (each carries the launch's mark in its "
        "environment) was alive when its launcher ended; the harness kills and counts any, "
        "and the detail names each: pid, command line and what started it; not judged for "
        "Docker nodes",
        figure="processes",
    )

    def judge(self, evidence: Evidence) -> Check:
        """Processes still alive with the launch's mark after it ended."""
        if evidence.left_behind is None:
            return self.not_judged(
                "this launcher does not look for processes left behind (docker nodes)",
                unit="processes",
                expected="0",
            )
        left = evidence.left_behind
        detail = (
            "no process outlived the launch"
            if left == 0
            else f"{left} {'process' if left == 1 else 'processes'} outlived the launch "
            "(killed by the harness)"
        )
        if evidence.left_processes:
            detail += ": " + "; ".join(evidence.left_processes)
        return self.verdict(left == 0, left, unit="processes", expected="0", detail=detail)
