"""Loss-spike faults: a learning-rate spike and bad batches, which throw the loss up for a
step or a few without any non-finite value, so only a spike detector can tell.

Every random choice draws from a private RNG keyed by (seed, kind, step, rank, what),
never from the global torch/numpy/python RNGs (see `faults.numeric`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

if TYPE_CHECKING:
    import torch
    from torch import nn
else:
    from faults.lazy_torch import nn, torch

from faults.bias import Bias
from faults.errors import InjectionError
from faults.injector import Injection, Injector, StepContext
from faults.spec import FaultClass, FaultSpec
from faults.tensors import require_optimizer, share, torch_generator

# -- lr_spike ------------------------------------------------------------------------------


class LrSpikeSpec(FaultSpec):
    """Multiply the learning rate for one optimizer step."""

    kind: Literal["lr_spike"] = "lr_spike"
    description: ClassVar[str] = "Multiply every param group's lr by a factor for the step."
    fault_class: ClassVar[FaultClass] = "loss_spike"

    factor: Annotated[float, Bias((100.0, 1e4), upto=1e6)] = Field(
        default=100.0, gt=1, allow_inf_nan=False, description="Multiplier of the lr, > 1."
    )


class LrSpikeInjector(Injector[LrSpikeSpec]):
    """Raises the lr just before ``optimizer.step`` and puts the originals back after it."""

    def __init__(self, spec: LrSpikeSpec) -> None:
        super().__init__(spec)
        self._saved: list[Any] = []
        self._optimizer: torch.optim.Optimizer | None = None

    def before_optimizer_step(self, ctx: StepContext) -> list[Injection]:
        """Spike the lr of every param group."""
        optimizer = require_optimizer(ctx, self.spec.kind)
        self._restore()  # never compound two spikes
        self._optimizer = optimizer
        self._saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            # A new object rather than in-place: a tensor lr must come back untouched.
            group["lr"] = group["lr"] * self.spec.factor
        details = {
            "lr_before": [float(lr) for lr in self._saved],
            "lr_during": [float(group["lr"]) for group in optimizer.param_groups],
            "factor": self.spec.factor,
        }
        return [Injection(fault=self.spec.kind, target="optimizer", details=details)]

    def after_optimizer_step(self, ctx: StepContext) -> list[Injection]:
        """Put the original lr objects back, exactly."""
        self._restore()
        return []

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Restore here too, in case the step ended without ``after_optimizer_step``."""
        self._restore()
        return []

    def _restore(self) -> None:
        if self._optimizer is not None:
            for group, lr in zip(self._optimizer.param_groups, self._saved, strict=True):
                group["lr"] = lr
        self._optimizer, self._saved = None, []


# -- bad_batch -----------------------------------------------------------------------------


class BadBatchSpec(FaultSpec):
    """Replace rows of the batch by uniform random tokens."""

    kind: Literal["bad_batch"] = "bad_batch"
    description: ClassVar[str] = "Replace a share of the batch's sequences by random token ids."
    fault_class: ClassVar[FaultClass] = "loss_spike"

    fraction: Annotated[float, Bias((1.0, 1e-9))] = Field(
        default=1.0,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Share of the rows (sequences) replaced (ceil, at least 1).",
    )
    vocab_size: Annotated[int | None, Bias((1, 2), only=True)] = Field(
        default=None,
        ge=1,
        description="Token ids drawn from [0, vocab_size); default: the model's first "
        "nn.Embedding size, else the batch's max + 1.",
    )


class BadBatchInjector(Injector[BadBatchSpec]):
    """Returns a copy of the batch with seeded rows replaced; the caller's tensor is kept."""

    def on_batch(
        self, ctx: StepContext, batch: torch.Tensor
    ) -> tuple[torch.Tensor, list[Injection]]:
        """A row is one sequence: the last dim holds tokens, leading dims are flattened."""
        spec = self.spec
        if batch.dtype.is_floating_point or batch.dtype.is_complex or batch.dtype == torch.bool:
            raise InjectionError(f"bad_batch needs a batch of token ids, got {batch.dtype}")
        if batch.numel() == 0:
            raise InjectionError(f"bad_batch got an empty batch of shape {tuple(batch.shape)}")
        vocab = self._vocab(ctx, batch)
        rows = batch.reshape(-1, batch.shape[-1]) if batch.dim() else batch.reshape(1, 1)
        n = rows.shape[0]
        gen = torch_generator(spec.seed, spec.kind, ctx.step, ctx.rank, "rows")
        chosen = torch.randperm(n, generator=gen)[: share(spec.fraction, n)].sort().values
        tokens = torch.randint(0, vocab, (len(chosen), rows.shape[1]), generator=gen)
        out = rows.clone()  # also a copy when reshape returned a view of the caller's batch
        out[chosen.to(out.device)] = tokens.to(device=out.device, dtype=out.dtype)
        details = {"rows": chosen.tolist(), "vocab_size": vocab, "of_rows": n}
        return out.view(batch.shape), [Injection(fault=spec.kind, target="batch", details=details)]

    def _vocab(self, ctx: StepContext, batch: torch.Tensor) -> int:
        if self.spec.vocab_size is not None:
            return self.spec.vocab_size
        if ctx.model is not None:
            for module in ctx.model.modules():
                if isinstance(module, nn.Embedding):
                    return module.num_embeddings
        return max(1, int(batch.max()) + 1)
