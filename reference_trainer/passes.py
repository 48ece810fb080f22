"""The forward and backward passes of one step, over fixed windows or (dynamic batching)
packed whole documents: the batch (a bad-data fault sees it first), the forward under
autocast, the scaled backward, and what the rest of the step needs of them. Over fixed
windows, a step that runs out of memory is redone with smaller micro-batches
(`reference_trainer.stability.oom_retry`) while nothing of it has left the rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.records.events import OMIT, Claim
from reference_trainer.hessian_step import HessianBatch
from reference_trainer.model.gpt import next_token_loss
from reference_trainer.packed_step import packed_forward_backward
from reference_trainer.stability.oom_retry import OOM_ERRORS
from reference_trainer.step_parts import BatchParts, micro_batch
from reference_trainer.stream.batching import PackedLoader


@dataclass(frozen=True, slots=True)
class Passes:
    """What the passes left for the rest of the step."""

    #: This rank's loss, as the ranks' agreement sums it.
    local: torch.Tensor
    #: The `step` event's ``local_loss``, ``pad_tokens``, ``fallback_tokens`` and
    #: ``batch_tokens`` fields (OMIT where they do not apply).
    observed: dict[str, Any]
    #: The batch, for a Hessian estimate on it.
    sample: HessianBatch
    #: Claims of the passes (a step redone with smaller micro-batches).
    claims: list[Claim] = field(default_factory=list)


def forward_backward(parts: BatchParts) -> Passes:
    """The step's passes over the loader's next batch."""
    if isinstance(parts.loader, PackedLoader):  # dynamic batching: docs/data.md
        step_batch = parts.loader.next_step()
        # Counted on the ids of the step's rows, before any bad-data fault.
        fallback = OMIT if parts.probe is None else parts.probe.count(step_batch.tokens.numpy())
        tokens = int(step_batch.lengths.sum())  # real tokens, not padding
        packed = packed_forward_backward(parts, step_batch)
        fields = {"local_loss": packed.local_loss, "pad_tokens": packed.pad_tokens}
        sample = HessianBatch(packed.micro, step_batch.targets)
        local = packed.local
    else:
        batch = parts.agent.batch(parts.loader.next_step())
        # Counted on the ids that reach the model, after any bad-data fault.
        fallback = OMIT if parts.probe is None else parts.probe.count(batch.numpy())
        tokens = int(batch.numel())
        batch = batch.to(parts.topo.device)
        sample = HessianBatch.windows(
            batch, parts.topo.world_size, tokens=parts.loader.tokens_per_step()
        )
        weight = parts.loader.loss_weight()
        local = _window_passes(parts, batch, weight)
        # (the rank's own mean loss; the agreement sums the weighted one)
        fields = {"local_loss": float(local) / weight, "pad_tokens": OMIT}
    fields["fallback_tokens"] = fallback
    fields["batch_tokens"] = tokens if parts.probe is not None else OMIT
    claims = parts.micro_split.take_claims() if parts.micro_split is not None else []
    return Passes(local, fields, sample, claims)


def _window_passes(parts: BatchParts, batch: torch.Tensor, weight: float) -> torch.Tensor:
    """The passes over a (micro-steps, B, T + 1) batch, cut as this rank's micro-batch split
    says, the loss multiplied by ``weight`` (this rank's share of the global batch over an
    even share); redone with smaller micro-batches after an out-of-memory error that came
    before any of the step's communication (`reference_trainer.stability.oom_retry`)."""
    split = parts.micro_split
    while True:
        sent = [False]  # the last micro-batch's backward began: DDP's all-reduces are out
        try:
            cut = split.split(batch) if split else batch
            return _micro_batches(parts, cut, sent, weight)
        except OOM_ERRORS as exc:
            if split is None or sent[0] or not split.halve(exc, batch, parts.agent.step):
                raise
            parts.optimizer.zero_grad(set_to_none=True)  # what the failed try accumulated


def _micro_batches(
    parts: BatchParts, batch: torch.Tensor, sent: list[bool], weight: float = 1.0
) -> torch.Tensor:
    """Forward and backward over each micro-batch of ``batch``; the mean loss over them
    (times ``weight``)."""
    accum = batch.shape[0]  # the loader's split (adaptive_batch may choose it)
    ddp = isinstance(parts.wrapped, DDP)
    local = torch.zeros((), device=parts.topo.device)
    for micro in range(accum):
        x, y = batch[micro, :, :-1], batch[micro, :, 1:]
        last = micro == accum - 1
        with micro_batch(parts, last=last):
            with parts.precision.autocast():
                logits = parts.wrapped(x)
                loss = next_token_loss(logits, y)
            trained = loss
            for mechanism in parts.mechanisms:
                mechanism.on_micro_batch(micro, logits, y)
                trained = mechanism.weigh_loss(micro, logits, y, trained)
            del logits  # backward does not need them: free the (B, T, V) tensor now
            sent[0] = ddp and last
            if weight != 1.0:  # (an even share divides exactly as it always did)
                loss = loss * weight
                trained = trained * weight
            parts.scaler.scale_loss(trained / accum).backward()  # type: ignore[no-untyped-call]
        local += loss.detach() / accum
    return local
