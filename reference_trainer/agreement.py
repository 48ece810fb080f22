"""The one collective of a step: every rank's loss, whether its loss and gradients are
finite, whether it was asked to stop (SIGTERM), its gradient norm, and each stability
mechanism's slice (`Mechanism.local_slice`), summed over ranks in one all-reduce. It is
the barrier every rank stops at, so that all ranks take the same decisions."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from reference_trainer.processes.distributed import Topology
from reference_trainer.stability.mechanism import Mechanism, StepState
from reference_trainer.stability.registry import in_order


def agree(
    s: StepState,
    local_loss: torch.Tensor,
    *,
    preempt: bool,
    mechanisms: list[Mechanism],
    topo: Topology,
) -> bool:
    """Set the step's mean loss over ranks, whether every rank's loss and gradients are
    finite and the mean gradient norm (meaningful when all are finite), hand each mechanism
    its slice summed over ranks; whether any rank was asked to stop."""
    device, dtype = local_loss.device, local_loss.dtype
    grad_norm = s.grad_norm
    finite = torch.isfinite(local_loss) & torch.tensor(math.isfinite(grad_norm), device=device)
    core = [float(preempt), grad_norm if math.isfinite(grad_norm) else 0.0]
    parts: list[torch.Tensor] = [
        torch.stack(
            [
                torch.nan_to_num(local_loss, nan=0.0, posinf=0.0, neginf=0.0),
                (~finite).to(dtype),
                local_loss,
            ]
        ),
        torch.tensor(core, device=device, dtype=dtype),
    ]
    owners: list[tuple[Mechanism | None, int]] = []
    for hooks, mechanism in in_order(mechanisms):
        values = mechanism.local_slice(s) if mechanism is not None else [0.0] * hooks.idle_slice
        if values is None or len(values) == 0:
            continue
        if isinstance(values, torch.Tensor):
            part = values.to(device, dtype)
        else:
            part = torch.tensor(values, device=device, dtype=dtype)
        parts.append(part)
        owners.append((mechanism, len(part)))
    packed = torch.cat(parts)
    if topo.distributed:
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    n = topo.world_size
    s.all_finite = bool(packed[1] == 0)
    # A non-finite loss anywhere makes the mean non-finite, as it should be.
    s.loss = float(packed[0] / n) if s.all_finite else float(packed[2] / n)
    s.mean_norm = float(packed[4] / n)
    start = 5
    for mechanism, width in owners:
        if mechanism is not None:
            mechanism.agreed(s, packed[start : start + width])
        start += width
    return bool(packed[3] > 0)
