"""What a command started by ``tightrope exec`` receives, and what it may be handed.

The launcher (`harness.running.exec`) puts the run dir and plan in these variables and the
bootstrap folder first on PYTHONPATH; the agent inside (`harness.inside.exec_runtime`,
`harness.inside.attach`) reads them back. Both sides import the names from here, so the
inside never imports the launcher.
"""

from __future__ import annotations

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
