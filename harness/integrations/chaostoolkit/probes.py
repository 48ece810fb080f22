"""Chaos Toolkit probes: what a job's journal and a suite's scorecard show.

Every answer is read from evidence: the journal's observed steps (the agent's, not the
trainer's word), the faults it journaled as injected, the responses the oracles accept as
detection (`harness.records.timeline.corroborated`), and a saved ``scorecard.json``.
Results are plain JSON for the experiment's journal; booleans and numbers suit a steady-state
hypothesis's tolerance (``true``, ``0``, ``{"type": "range", "range": [90, 100]}``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from harness.records.events import StepObserved
from harness.records.journal import Journal, json_safe, read_journal
from harness.records.status import job_status
from harness.records.timeline import corroborated, faults
from harness.run_layout import RunLayout
from harness.running import background
from harness.scorecard.jsonio import load_scorecard


def _journal(run_dir: str) -> Journal:
    return read_journal(run_dir, warn=False)


def run_status(run_dir: str) -> dict[str, Any]:
    """Step, loss, faults armed, fired and refused (as ``tightrope status`` shows them),
    and whether a job started in the background on ``run_dir`` still has processes."""
    status = job_status(_journal(run_dir))
    record = background.read_record(RunLayout(run_dir).background)
    out: dict[str, Any] = dataclasses.asdict(status)
    out["processes"] = len(background.alive(record)) if record is not None else None
    result: dict[str, Any] = json_safe(out)
    return result


def _latest_steps(journal: Journal) -> list[Any]:
    """The last step event of every rank."""
    latest = {}
    for event in journal.of_kind(StepObserved):
        latest[event.rank] = event
    return list(latest.values())


def job_is_training(run_dir: str, within_s: float = 30.0) -> bool:
    """True when the job is running (started, not ended) and journals a step it had not
    reached yet within ``within_s`` seconds: a job that claims to run but is stuck is not
    training."""
    start = job_status(_journal(run_dir))
    deadline = time.monotonic() + within_s
    while True:
        now = job_status(_journal(run_dir))
        if not now.running:
            return False
        if now.step > start.step:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def loss_is_finite(run_dir: str) -> bool:
    """True when the latest step of every rank has a finite loss and, where the agent
    looked, finite parameters; False with no step at all (no evidence is no pass)."""
    latest = _latest_steps(_journal(run_dir))
    if not latest:
        return False
    return all(
        isinstance(e.get("loss"), (int, float))
        and math.isfinite(e["loss"])
        and e.get("params_finite") is not False
        for e in latest
    )


def undetected_faults(run_dir: str) -> int:
    """How many of the faults the job journaled as injected no observed response followed
    (no step skipped, gradient repaired, rollback, restart or file refused): 0 holds."""
    journal = _journal(run_dir)
    return sum(1 for fault in faults(journal) if not corroborated(journal, fault)[0])


def fault_detected(run_dir: str, kind: str | None = None, wait_s: float = 30.0) -> dict[str, Any]:
    """Wait up to ``wait_s`` for a fault (of ``kind``, when given) to fire and be detected;
    where and how: the fault's step, what detected it (responses seen, and claims they
    back) and claims nothing backs."""
    deadline = time.monotonic() + wait_s
    while True:
        journal = _journal(run_dir)
        fired = [f for f in faults(journal) if kind is None or f.get("fault") == kind]
        if fired:
            fault = fired[0]
            counted, words = corroborated(journal, fault)
            if counted or time.monotonic() >= deadline:
                return {
                    "fired": True,
                    "detected": bool(counted),
                    "fault": fault.get("fault"),
                    "step": fault.step,
                    "rank": fault.rank,
                    "detected_by": sorted({d.detector for d in counted}),
                    "unbacked_claims": sorted({d.detector for d in words}),
                    "latency_steps": max(0, counted[0].event.step - fault.step)
                    if counted
                    else None,
                }
        if time.monotonic() >= deadline:
            return {"fired": False, "detected": False, "fault": kind, "step": None}
        time.sleep(0.2)


def resilience_score(scorecard: str) -> float:
    """The suite's resilience score, 0 to 100, from its saved scorecard."""
    return load_scorecard(Path(scorecard)).score


def suite_passed(scorecard: str) -> bool:
    """True when every scenario passed and the score met ``--min-score`` (when set)."""
    return load_scorecard(Path(scorecard)).passed


def check_results(scorecard: str) -> dict[str, Any]:
    """Each scenario's status and score and each of its checks' status, figure and
    detail, from the saved scorecard; not judged stays not judged."""
    result = load_scorecard(Path(scorecard))
    out: dict[str, Any] = {
        "score": result.score,
        "passed": result.passed,
        "counts": result.counts(),
        "scenarios": {
            s.name: {
                "status": s.status,
                "score": s.score,
                "error": s.error,
                "checks": {
                    c.name: {"status": c.status, "figure": c.figure, "detail": c.detail}
                    for c in s.checks
                },
            }
            for s in result.scenarios
        },
    }
    safe: dict[str, Any] = json_safe(out)
    return safe
