"""The adaptive batch split in the run (opt-in, docs/stability.md): decided once per
process when the trainer is built (so again after every restart, on whatever machine the
process now runs), applied to this rank's loader, and journaled as a `batch_split` claim
at the process's first step."""

from __future__ import annotations

import os
from typing import Any

import torch

from harness.records.events import BatchSplit
from reference_trainer.stability.adaptive_batch import (
    AdaptiveBatchConfig,
    choose,
    fitting,
    memory,
    splits,
)
from reference_trainer.stability.batch_probe import probe_model, sequence_mb, step_seconds
from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState
from reference_trainer.stability.precision import Precision


class AdaptiveBatch(Mechanism):
    """Holds the decision and journals it once."""

    name = "adaptive_batch"

    def __init__(self, decision: BatchSplit) -> None:
        self.decision: BatchSplit | None = decision

    @classmethod
    def build(cls, ctx: BuildContext) -> AdaptiveBatch | None:
        """Decide and apply the split when switched on (fixed windows only: the config
        refuses dynamic batching with it)."""
        cfg = ctx.stability.adaptive_batch
        if not cfg.enabled:
            return None
        loader = ctx.loader
        decision = decide(cfg, ctx, loader.batch_size * loader.grad_accum)
        loader.batch_size, loader.grad_accum = decision.micro_batch, decision.grad_accum
        return cls(decision)

    def begin_step(self, s: StepState) -> None:
        """The process's first step: journal the decision."""
        if self.decision is not None:
            s.claims.append(self.decision)
            self.decision = None

    def state_dict(self) -> dict[str, Any]:
        """Nothing: every process decides for the machine it runs on."""
        return {}


def decide(cfg: AdaptiveBatchConfig, ctx: BuildContext, per_rank: int) -> BatchSplit:
    """Measure, choose, and say so."""
    device = ctx.topo.device
    precision = Precision(ctx.precision, device.type)
    mem = memory(cfg, device)
    limit = mem.limit(cfg)
    with probe_model(ctx.model.config, device) as model:
        per_sequence = sequence_mb(model, precision)
        fit = fitting(per_rank, per_sequence, limit)
        timed = step_seconds(model, precision, fit) if cfg.measure_time and fit else {}
    split, reason = choose(per_rank, per_sequence, limit, timed, cfg.time_margin)
    return BatchSplit(
        micro_batch=split.micro,
        grad_accum=split.accum,
        world_size=ctx.topo.world_size,
        global_batch=split.micro * split.accum * ctx.topo.world_size,
        candidates=[s.micro for s in splits(per_rank)],
        memory_budget_mb=round(mem.budget, 1),
        memory_used_mb=round(mem.used, 1),
        limit_mb=round(limit, 3),
        sequence_mb=round(per_sequence, 4),
        step_seconds={str(m): round(t, 5) for m, t in timed.items()},
        threads=torch.get_num_threads(),
        cpus=os.cpu_count() or 0,
        device=str(device),
        reason=reason,
    )
