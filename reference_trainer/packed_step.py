"""The forward and backward passes of a step under dynamic batching (docs/data.md): every
real token of the step weighs the same, whichever micro-step or rank it falls on.

The step's loss is (sum of token losses over all ranks and micro-steps) / (the step's
real-token count). Every rank knows that count without a collective: each loader packs
the whole step and keeps its share. Data-parallel training averages gradients over the
W ranks, so a rank backpropagates its micro-steps' summed losses times W / count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_trainer.step_parts import StepParts, micro_batch
from reference_trainer.stream.batching import (
    PackedStep,
    masked_targets,
    summed_token_loss,
)


@dataclass(frozen=True, slots=True)
class PackedPasses:
    """What the passes left for the rest of the step."""

    #: This rank's part of the step's loss (its summed token losses x W / count): the sum
    #: over ranks, divided by W as the step's agreement does, is the step's token mean.
    local: torch.Tensor
    #: Mean token loss of this rank's share alone.
    local_loss: float
    #: Padded target positions of the step, over all ranks.
    pad_tokens: int
    #: (inputs, targets) of each micro-batch, for a Hessian estimate on the same batch.
    micro: list[tuple[torch.Tensor, torch.Tensor]]


def packed_forward_backward(trainer: StepParts, packed: PackedStep) -> PackedPasses:
    """Forward and backward over this rank's micro-batches (a bad-data fault sees the rows
    first), each weighted by its share of the step's real tokens."""
    device = trainer.topo.device
    tokens = trainer.agent.batch(packed.tokens)
    if tokens.shape != packed.tokens.shape:
        raise ValueError(
            f"a batch fault changed the rows' shape from {tuple(packed.tokens.shape)} "
            f"to {tuple(tokens.shape)}"
        )
    tokens, lengths = tokens.to(device), packed.lengths.to(device)
    weight = trainer.topo.world_size / packed.targets
    local = torch.zeros((), device=device)
    summed = torch.zeros((), device=device)
    start = 0
    last = len(packed.micro_rows) - 1
    micro_batches = []
    for micro, rows in enumerate(packed.micro_rows):
        part = slice(start, start + rows)
        start += rows
        width = int(packed.lengths[part].max())  # this micro-batch's longest piece
        x = tokens[part, : width - 1]
        y = masked_targets(tokens[part], lengths[part], width)
        micro_batches.append((x, y))
        with micro_batch(trainer, last=micro == last):
            with trainer.precision.autocast():
                total = summed_token_loss(trainer.wrapped(x), y)
            trainer.scaler.scale_loss(total * weight).backward()  # type: ignore[no-untyped-call]
        local += total.detach() * weight
        summed += total.detach()
    return PackedPasses(
        local, float(summed) / packed.local_targets, packed.pad_tokens, micro_batches
    )
