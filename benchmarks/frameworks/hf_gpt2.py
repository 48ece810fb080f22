"""A GPT-2 (``--size``, gpt2_sizes.py) trained by Hugging Face's ``Trainer``, timing its steps.

``python benchmarks/frameworks/hf_gpt2.py --steps N --out FILE``: ``N`` optimizer steps on
synthetic tokens, then ``{"steps": ..., "step_s": [...], "cpu_s": [...]}`` in FILE:
``step_s`` the time between consecutive step ends (the first from the start of training),
``cpu_s`` the process's CPU time over the same spans, both taken by a ``TrainerCallback``
in the trainer's own process. No logging, progress bar, evaluation or checkpoint: only
steps are timed. Written for ``framework_overhead.py``, which runs it bare and under
``tightrope exec``; it knows nothing of tightrope.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

import torch
from gpt2_sizes import SIZES, Size  # this folder: the script is run as a file
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging


class StepClock(TrainerCallback):
    """``time.perf_counter`` and ``time.process_time`` (every thread's CPU time) at the
    start of training and at each step's end."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.cpu: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        """The first mark."""
        self.marks, self.cpu = [time.perf_counter()], [time.process_time()]

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        """A step's end: after the optimizer step, the scheduler and ``zero_grad``."""
        self.marks.append(time.perf_counter())
        self.cpu.append(time.process_time())


class Tokens(torch.utils.data.Dataset):
    """``count`` fixed random sequences of the model's size, their own labels (causal LM)."""

    def __init__(self, count: int, size: Size, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, size.vocab, (count, size.seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


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
    size = SIZES[args.size]
    model = GPT2LMHeadModel(GPT2Config(**size.config()))
    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="hf-gpt2-") as tmp:
        training = TrainingArguments(
            output_dir=tmp, max_steps=args.steps, per_device_train_batch_size=args.batch,
            learning_rate=1e-3, max_grad_norm=1.0, use_cpu=True, report_to="none",
            logging_strategy="no", save_strategy="no", eval_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0, seed=0,
        )  # fmt: skip
        trainer = Trainer(model=model, args=training, train_dataset=Tokens(64 * args.batch, size),
                          callbacks=[clock])  # fmt: skip
        trainer.train()
        steps = trainer.state.global_step
    step_s = [b - a for a, b in itertools.pairwise(clock.marks)]
    cpu_s = [b - a for a, b in itertools.pairwise(clock.cpu)]
    args.out.write_text(json.dumps({"framework": "transformers", "steps": steps,
                                    "step_s": step_s, "cpu_s": cpu_s}))  # fmt: skip


if __name__ == "__main__":
    main()
