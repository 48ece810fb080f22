"""Sophia-G's Hessian estimate inside the training step (docs/stability.md, "Sophia").

After the update of steps 1, 1 + k, 1 + 2k, ... the step runs one more forward and backward
pass over the batch it trained on, with labels sampled from the model's own softmax
instead of the data's (the Gauss-Newton-Bartlett estimator). The backward runs through the
DDP wrapper, so the estimate's gradients are all-reduced as the real ones are: that is the
extra communication Sophia costs every k steps. The optimizer folds ``tokens * g_hat ** 2``
into its moving average (`SophiaG.update_hessian`).

The labels are drawn from a generator seeded by (run seed, step, rank), so a resumed or
replayed step draws the same labels: resume stays bit-exact with no generator in the
checkpoint. A non-finite estimate is dropped before it reaches the average, under the same
switch as the step's non-finite guard (and always in fp16, where it is an overflow); the
gradients are the same on every rank after the all-reduce, so every rank drops it alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.records.events import Claim, Detected
from reference_trainer.model.sophia import SophiaG
from reference_trainer.step_parts import StepParts, micro_batch
from reference_trainer.stream.batching import IGNORE_INDEX


@dataclass(frozen=True, slots=True)
class HessianBatch:
    """The batch a step trained on, as the estimate reads it."""

    #: (inputs, targets) of each micro-batch; only which targets are `IGNORE_INDEX` (padding,
    #: not counted) matters: the estimate's labels are sampled.
    micro: list[tuple[torch.Tensor, torch.Tensor]]
    #: Target positions counted over every rank and micro-batch (the estimator's B).
    tokens: int

    @classmethod
    def windows(
        cls, batch: torch.Tensor, world_size: int, *, tokens: int | None = None
    ) -> HessianBatch:
        """From a fixed-window batch of shape (micro-steps, B, T + 1), alike on every rank
        unless ``tokens`` gives the count over every rank (uneven shares)."""
        micro = [(batch[m, :, :-1], batch[m, :, 1:]) for m in range(batch.shape[0])]
        return cls(micro, batch[:, :, 1:].numel() * world_size if tokens is None else tokens)


@dataclass(slots=True)
class HessianEstimator:
    """When the estimate is due and how it is made (one per run)."""

    every: int
    seed: int
    #: Drop a non-finite estimate (the non-finite guard's switch).
    guard: bool

    @classmethod
    def of(cls, trainer: StepParts) -> HessianEstimator | None:
        """The estimator for the trainer's optimizer, or None when it takes no Hessian."""
        if not isinstance(trainer.optimizer, SophiaG):
            return None
        cfg = trainer.cfg
        guard = cfg.stability.nonfinite_guard
        return cls(every=cfg.optim.sophia.hessian_every, seed=cfg.seed, guard=guard)

    def due(self, step: int) -> bool:
        """Whether the estimate follows the update of 1-based ``step``."""
        return (step - 1) % self.every == 0

    def after_update(self, trainer: StepParts, step: int, batch: HessianBatch) -> list[Claim]:
        """Estimate the Hessian on ``batch`` when due and fold it into the optimizer's
        average; the claims of an estimate dropped as non-finite."""
        if not self.due(step):
            return []
        optimizer = trainer.optimizer
        assert isinstance(optimizer, SophiaG)
        optimizer.zero_grad(set_to_none=True)
        scale = trainer.scaler.current() or 1.0
        generator = torch.Generator(device=trainer.topo.device)
        generator.manual_seed(_mix(self.seed, step, trainer.topo.rank))
        weight = trainer.topo.world_size / batch.tokens
        last = len(batch.micro) - 1
        for i, (x, targets) in enumerate(batch.micro):
            with micro_batch(trainer, last=i == last):
                with trainer.precision.autocast():
                    logits = trainer.wrapped(x)
                labels = sampled_labels(logits, targets, generator)
                loss = F.cross_entropy(
                    logits.float().view(-1, logits.size(-1)),
                    labels.view(-1),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
                del logits
                # Summed over this rank's counted tokens x W / all of them: DDP's mean over
                # ranks makes it the mean over the step's tokens, as the estimator wants.
                (loss * (weight * scale)).backward()  # type: ignore[no-untyped-call]
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        if scale != 1.0:
            torch._foreach_div_(grads, scale)
        finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        claims: list[Claim] = []
        if finite or not (self.guard or trainer.scaler.active):
            optimizer.update_hessian(batch.tokens)
        else:
            detector = "fp16_overflow" if trainer.scaler.active else "nonfinite_guard"
            claims.append(Detected(detector=detector, details={"hessian_estimate": "dropped"}))
        optimizer.zero_grad(set_to_none=True)
        return claims


def sampled_labels(
    logits: torch.Tensor, targets: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """One label per position drawn from softmax(``logits``) (the Gumbel-max draw: never
    raises, even on non-finite logits, so no rank stops alone before the all-reduce);
    `IGNORE_INDEX` where ``targets`` is."""
    with torch.no_grad():
        noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        noise.exponential_(generator=generator)
        labels = (logits.float() - noise.log()).argmax(dim=-1)
        return labels.masked_fill_(targets == IGNORE_INDEX, IGNORE_INDEX)


def _mix(seed: int, step: int, rank: int) -> int:
    """A generator seed of its own for each (run seed, step, rank)."""
    return ((seed * 1_000_003 + step) * 1009 + rank) & (2**63 - 1)
