"""The same GPT-2 (``--size``, gpt2_sizes.py) trained by Lightning's ``Trainer``, timing steps.

``python benchmarks/frameworks/lightning_gpt2.py --steps N --out FILE``: ``N`` optimizer
steps on synthetic tokens with automatic optimization and ``gradient_clip_val`` set, so
each forward and backward runs inside ``optimizer.step(closure)``; then ``{"steps": ...,
"step_s": [...], "cpu_s": [...]}`` in FILE: ``step_s`` the time between consecutive batch
ends (the first from the start of training), ``cpu_s`` the process's CPU time over the
same spans, both taken by a ``Callback`` in the trainer's own process. No logger, progress
bar, model summary, validation or checkpoint: only steps are timed. Written for
``framework_overhead.py``, which runs it bare and under ``tightrope exec``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from gpt2_sizes import SIZES, Size  # this folder: the script is run as a file
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging


class StepClock(L.Callback):
    """``time.perf_counter`` and ``time.process_time`` (every thread's CPU time) at the
    start of training and at each batch's end."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.cpu: list[float] = []

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """The first mark."""
        self.marks, self.cpu = [time.perf_counter()], [time.process_time()]

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:  # fmt: skip
        """A step's end: after ``optimizer.step(closure)`` and ``zero_grad``."""
        self.marks.append(time.perf_counter())
        self.cpu.append(time.process_time())


class GPT2(L.LightningModule):
    """GPT-2 as a causal LM on its own tokens, AdamW (as Hugging Face's Trainer sets it)."""

    def __init__(self, size: Size) -> None:
        super().__init__()
        self.model = GPT2LMHeadModel(GPT2Config(**size.config()))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        """The loss of one batch."""
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW, lr 1e-3."""
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    """Train, write the step times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    size = SIZES[args.size]
    tokens = torch.randint(0, size.vocab, (64 * args.batch, size.seq), generator=g)
    loader = torch.utils.data.DataLoader(tokens, batch_size=args.batch, shuffle=True)
    clock = StepClock()
    trainer = L.Trainer(
        max_steps=args.steps, accelerator="cpu", devices=1, gradient_clip_val=1.0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        callbacks=[clock],
    )  # fmt: skip
    trainer.fit(GPT2(size), loader)
    step_s = [b - a for a, b in itertools.pairwise(clock.marks)]
    cpu_s = [b - a for a, b in itertools.pairwise(clock.cpu)]
    args.out.write_text(json.dumps({"framework": "lightning", "steps": trainer.global_step,
                                    "step_s": step_s, "cpu_s": cpu_s}))  # fmt: skip


if __name__ == "__main__":
    main()
