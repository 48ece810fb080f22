"""Attach the agent to a trainer that knows nothing of tightrope: hooks instead of calls.

``agent = harness.attach(model, optimizer, run_dir="runs/x", plan="plan.yaml")``; then,
optionally, ``loader = agent.wrap_batches(loader)`` and ``agent.close()``. The optimizer
may be None: a trainer that updates its parameters by hand is followed as well. What a
step is, what is observed and where faults land: `AttachedAgent`
(`harness.inside.attached_agent`) and docs/attach.md.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import torch
from torch import nn

from faults import FaultPlan
from harness.inside.agent import Agent
from harness.inside.attached_agent import ATTACHED, AttachedAgent
from harness.inside.exec_env import check_plan
from harness.inside.trainer_shape import (
    data_parallel,
    restart_count,
    topology,
    unwrap,
)
from harness.records.events import (
    Detected,
)

#: Steps between the attached agent's looks at every parameter and gradient (besides every
#: step with an injection and the end of the run): each is a pass over the model, and a
#: trainer whose steps the agent did not write pays for it.
CHECK_EVERY = 50


def attach(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    run_dir: str | os.PathLike[str],
    plan: FaultPlan | str | os.PathLike[str] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    check_params_every: int = CHECK_EVERY,
) -> AttachedAgent:
    """Attach an agent to ``model`` and ``optimizer`` (None for a trainer that updates by
    hand); the step loop needs no other change."""
    if plan is not None and not isinstance(plan, FaultPlan):
        plan = FaultPlan.from_yaml(Path(plan))
    check_plan(plan or FaultPlan())
    rank, world_size = topology(rank, world_size)
    target = unwrap(model)
    agent = Agent(run_dir, rank=rank, world_size=world_size, restart=restart_count(), plan=plan)
    agent.check_params_every = check_params_every
    if (wrapper := data_parallel(model)) is not None:
        agent.watch_data_parallel(wrapper)
    attached = AttachedAgent(agent)
    attached.set_model(target)
    if optimizer is not None:
        attached.hook_optimizer(optimizer)
    attached.begin()
    return attached


def claim(detector: str, **details: Any) -> None:
    """Say, from a trainer, that ``detector`` saw a problem (journaled as ``detected``).

    A claim is a word: the oracles count it only when what the trainer did backs it (a
    step skipped, a rollback, a restart, a file refused). Outside an attached run it does
    nothing, so a trainer can call it unconditionally."""
    if ATTACHED:
        ATTACHED[-1].agent.claim(Detected(detector=detector, details=details))


class _CallableModule(types.ModuleType):
    """Importing this module makes ``harness.inside.attach`` name it; calling it still attaches."""

    def __call__(self, *args: Any, **kwargs: Any) -> AttachedAgent:
        return attach(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
__all__ = ["AttachedAgent", "attach", "claim"]
