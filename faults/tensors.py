"""Helpers the numeric, bit-flip and loss-spike faults share: private random generators,
how many items a fraction hits, the optimizer a fault needs, flat tensor coordinates."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:
    from faults.lazy_torch import torch

from faults.errors import InjectionError
from faults.injector import StepContext
from faults.spec import seeded


def torch_generator(seed: int, *parts: object) -> torch.Generator:
    """A private CPU torch generator for one decision, derived like `seeded`."""
    return torch.Generator().manual_seed(seeded(seed, *parts).getrandbits(63))


def share(fraction: float, n: int) -> int:
    """How many of ``n`` items a ``fraction`` hits: ceil(fraction * n), at least 1, at most n."""
    # The tolerance keeps float noise (0.1 * 30 = 3.0000000000000004) from adding one.
    return min(n, max(1, math.ceil(fraction * n - 1e-6)))


def require_optimizer(ctx: StepContext, kind: str) -> torch.optim.Optimizer:
    """The optimizer, or a clear error when the agent was attached without one."""
    if ctx.optimizer is None:
        raise InjectionError(f"{kind} needs the optimizer; attach the agent with one")
    return ctx.optimizer


def flat_coords(t: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Index tensors addressing flat positions of ``t`` (any strides; a 0-d tensor as 1-d)."""
    return torch.unravel_index(indices.to(t.device), t.shape if t.dim() else (1,))


def as_1d_if_scalar(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a 1-element view of a 0-d tensor, so `flat_coords` index it."""
    return t if t.dim() else t.view(1)
