"""The pieces of the trainer that the passes of a step work with, as a protocol: the passes
(`passes`, `packed_step`, `hessian_step`) take any object that has them, and know nothing
of the `Trainer` that holds them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from torch.nn.parallel import DistributedDataParallel as DDP

if TYPE_CHECKING:
    import torch

    from harness.inside.agent import Agent
    from reference_trainer.config import TrainConfig
    from reference_trainer.model.gpt import GPT
    from reference_trainer.processes.distributed import Topology
    from reference_trainer.stability.loss_scale import DynamicLossScaler
    from reference_trainer.stability.mechanism import Mechanism
    from reference_trainer.stability.oom_retry import MicroBatchSplit
    from reference_trainer.stability.precision import Precision
    from reference_trainer.stream.batching import PackedLoader
    from reference_trainer.stream.data import ShardedLoader
    from reference_trainer.tokenizer.fallback import FallbackProbe


class StepParts(Protocol):
    """What a step's passes need: the model (bare and wrapped), its optimizer, precision
    and loss scale, the ranks, and the agent that sees the batch."""

    cfg: TrainConfig
    topo: Topology
    model: GPT
    wrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    scaler: DynamicLossScaler
    agent: Agent


class BatchParts(StepParts, Protocol):
    """The same, with where the batches come from and what watches them."""

    loader: ShardedLoader | PackedLoader
    #: Counts the byte-fallback tokens of each batch (None: not counted).
    probe: FallbackProbe | None
    #: The stability mechanisms on in this run, in the registry's order.
    mechanisms: list[Mechanism]
    #: This rank's micro-batch split, halved after an out-of-memory error (None: off).
    micro_split: MicroBatchSplit | None


@contextlib.contextmanager
def micro_batch(parts: StepParts, *, last: bool) -> Iterator[None]:
    """Around one micro-batch's forward and backward: DDP's ``no_sync`` unless it is the
    ``last`` of its step (gradients are all-reduced once a step, on the last backward),
    and the matrix-product kernels of the run's precision (`Precision.kernels`)."""
    with contextlib.ExitStack() as stack:
        if not last and isinstance(parts.wrapped, DDP):
            stack.enter_context(parts.wrapped.no_sync())
        stack.enter_context(parts.precision.kernels())
        yield
