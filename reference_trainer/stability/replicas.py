"""Replica consistency: the ranks of a data-parallel run compare a fingerprint of their
parameters every ``every`` steps and before every checkpoint save; a mismatch (a bit flipped
in one rank's memory, which DDP never notices: it only averages gradients) is a failure that
recovery answers by restoring the last checkpoint on every rank.

The fingerprint is the agent's (`harness.inside.step_evidence.params_fingerprint`: per
tensor the sum of its elements' bit patterns, hashed), all-gathered as one int64 per rank.
The rank that differs is one not holding the most common fingerprint; when two are equally
common (two ranks that disagree) every rank is named. Checkpoints are written only after a
check at their step passed, so the one recovery restores was taken from agreeing replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from harness.inside.step_evidence import params_fingerprint
from harness.replica_prints import odd_ranks
from reference_trainer.processes.distributed import Topology


@dataclass(kw_only=True, slots=True)
class ReplicaCheckConfig:
    """How often the ranks compare their parameters."""

    enabled: bool = True
    every: int = 10
    """Compare every this many steps (and at every checkpoint save)."""

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(
                f"stability.replica_check.every must be an int >= 1 (got {self.every!r})"
            )


@dataclass(frozen=True, slots=True)
class Divergence:
    """The replicas disagreed: each rank's fingerprint and the ranks that differ."""

    fingerprints: dict[int, str]
    ranks: list[int]


def _signed(value: int) -> int:
    """A 64-bit unsigned value as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def compare_replicas(model: nn.Module, topo: Topology) -> Divergence | None:
    """Gather every rank's fingerprint; the divergence, or None when all agree."""
    if not topo.distributed:
        return None
    mine = torch.tensor([_signed(params_fingerprint(model))], dtype=torch.int64, device=topo.device)
    gathered = [torch.zeros_like(mine) for _ in range(topo.world_size)]
    dist.all_gather(gathered, mine)
    prints = {rank: f"{int(t.item()) & (2**64 - 1):016x}" for rank, t in enumerate(gathered)}
    ranks = odd_ranks(prints)
    return Divergence(prints, ranks) if ranks else None
