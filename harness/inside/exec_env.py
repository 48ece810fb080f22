"""What a command started by ``tightrope exec`` receives, and what it may be handed.

The launcher (`harness.running.exec`) puts the run dir and plan in these variables and the
bootstrap folder first on PYTHONPATH (`child_env`; the warm-start launcher and the crash
points' driver build the same environment with it); the agent inside (`harness.inside.exec_runtime`,
`harness.inside.attach`) reads them back. Both sides import the names from here, so the
inside never imports the launcher.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from faults import FaultPlan, FaultSpecError

ENV_RUN_DIR = "TIGHTROPE_RUN_DIR"
ENV_PLAN = "TIGHTROPE_PLAN"
#: "1": the agent fingerprints the parameters after every step (``tightrope crashpoints``
#: compares a resumed run with a fault-free one by them); any process with an agent reads it.
ENV_FINGERPRINT = "TIGHTROPE_FINGERPRINT_EVERY_STEP"
#: The folder whose sitecustomize.py attaches the agent inside the command (harness.inside).
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"


def check_plan(plan: FaultPlan) -> FaultPlan:
    """``plan``, unless it holds a fault an attached trainer cannot meet (one that acts on
    the document stream)."""
    for i, spec in enumerate(plan):
        if spec.reach == "documents":
            raise FaultSpecError(
                f"plan.faults[{i}]: {spec.kind} acts on the reference trainer's document "
                "stream; an attached trainer has none (see docs/attach.md)"
            )
    return plan


def child_env(base: Mapping[str, str], run_dir: Path, plan: Path | None) -> dict[str, str]:
    """The command's environment: ``base`` plus the bootstrap folder, run dir and plan."""
    env = dict(base)
    env[ENV_RUN_DIR] = str(run_dir.resolve())
    if plan is not None:
        env[ENV_PLAN] = str(plan.resolve())
    else:
        env.pop(ENV_PLAN, None)
    here = str(BOOTSTRAP_DIR)
    rest = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    env["PYTHONPATH"] = os.pathsep.join([here, *rest])
    return env
