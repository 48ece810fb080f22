"""What the adaptive batch split (`adaptive_batch`) measures before training, on a model of
the run's shape built aside (its own random state, no hook of the run's, dropped after):
the activation memory one more sequence in a micro-batch costs, counted as the bytes of
the tensors autograd saves for the backward pass plus the logits, and the time of one
optimizer step's forward and backward passes at each split."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from reference_trainer.model.gpt import GPT, GPTConfig, next_token_loss
from reference_trainer.stability.adaptive_batch import MB, Split
from reference_trainer.stability.precision import Precision


@contextmanager
def probe_model(config: GPTConfig, device: torch.device) -> Iterator[GPT]:
    """A model of this shape whose building and passes leave the run's random state alone."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        model = GPT(config).to(device)
        yield model
    del model


def _saved_bytes(model: GPT, micro: int, precision: Precision) -> int:
    """Bytes of the distinct storages autograd saves in a forward pass of ``micro``
    sequences, plus the logits (alive until the loss is taken)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.zeros((micro, model.config.block_size), dtype=torch.long, device=_device(model))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), precision.autocast():
        logits = model(x)
        loss = next_token_loss(logits, x)
    storages[logits.untyped_storage().data_ptr()] = logits.untyped_storage().nbytes()
    del loss, logits
    return sum(storages.values())


def sequence_mb(model: GPT, precision: Precision) -> float:
    """Activation memory of one more sequence in a micro-batch, MiB (the difference between
    two sequences and one: what does not grow with the batch, the weights, cancels)."""
    return (_saved_bytes(model, 2, precision) - _saved_bytes(model, 1, precision)) / MB


def step_seconds(
    model: GPT, precision: Precision, candidates: Sequence[Split], repeats: int = 2
) -> dict[int, float]:
    """Per candidate's micro-batch size: the best of ``repeats`` timings of one step's
    forward and backward passes (``accum`` micro-batches) at that split."""
    per_rank = candidates[0].micro * candidates[0].accum
    gen = torch.Generator().manual_seed(0)
    window = model.config.block_size + 1
    batch = torch.randint(0, model.config.vocab_size, (per_rank, window), generator=gen)
    batch = batch.to(_device(model))

    def one_step(split: Split) -> float:
        t0 = time.perf_counter()
        for a in range(split.accum):
            rows = batch[a * split.micro : (a + 1) * split.micro]
            with precision.kernels():
                with precision.autocast():
                    loss = next_token_loss(model(rows[:, :-1]), rows[:, 1:])
                (loss / split.accum).backward()  # type: ignore[no-untyped-call]
        if batch.device.type == "cuda":
            torch.cuda.synchronize(batch.device)
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    one_step(candidates[-1])  # warm up (allocator, kernels) untimed
    return {s.micro: min(one_step(s) for _ in range(repeats)) for s in candidates}


def _device(model: GPT) -> torch.device:
    return next(model.parameters()).device
