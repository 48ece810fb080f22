"""A Hugging Face ``Trainer`` script as its docs show one: a tiny GPT-2 built from a config,
``TrainingArguments`` with ``save_steps`` and ``max_grad_norm``, and the documented resume,
``trainer.train(resume_from_checkpoint=True)`` when ``get_last_checkpoint(output_dir)`` finds a
``checkpoint-N`` folder (as the ``run_clm.py`` example does).

``python tests/frameworks/hf_trainer.py --steps 30 --save-every 8 [--out DIR] [--guard]
[--final-weights PATH]``, or
with several ranks ``python -m torch.distributed.run --standalone --nproc-per-node 2
tests/frameworks/hf_trainer.py ...`` (gloo on CPU). ``--guard`` adds a ``TrainerCallback``
that drops the update of a step whose gradients are not finite (``on_pre_optimizer_step``:
the gradients are set to None, so AdamW leaves every parameter as it was). Prints ``final
loss <repr> at step N`` at the end; with ``--final-weights`` rank 0 also writes the model's
weights there as safetensors (``final_weights.py``), for a crash-point comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from final_weights import save_final_weights  # beside this script, first on sys.path
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

VOCAB, SEQ, SAMPLES = 64, 16, 256


class CountingDataset(Dataset):
    """Sequences in which each token follows the last (mod VOCAB): something to learn."""

    def __init__(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (SAMPLES, 1), generator=generator)
        self.tokens = (start + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class SkipNonFiniteGradients(TrainerCallback):
    """Skip the optimizer step when any gradient is NaN or inf (after clipping, which does not
    repair a NaN): with every gradient set to None the optimizer updates nothing."""

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not all(torch.isfinite(g).all() for g in grads):
            print(f"non-finite gradients at step {state.global_step + 1}; update skipped")
            for p in model.parameters():
                p.grad = None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=8)
    parser.add_argument("--out", default=".", help="output_dir: checkpoint-N/ folders")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guard", action="store_true", help="skip steps with non-finite grads")
    parser.add_argument("--final-weights", help="write the final weights here (safetensors)")
    args = parser.parse_args()

    set_seed(args.seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    training_args = TrainingArguments(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        save_strategy="steps",
        save_steps=args.save_every,
        logging_steps=10,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        ddp_backend="gloo" if distributed else None,
        ddp_find_unused_parameters=False if distributed else None,
        dataloader_num_workers=0,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=CountingDataset(args.seed),
        callbacks=[SkipNonFiniteGradients()] if args.guard else [],
    )
    last_checkpoint = get_last_checkpoint(args.out) if Path(args.out).is_dir() else None
    if last_checkpoint is not None:
        print(f"Checkpoint detected, resuming training at {last_checkpoint}", flush=True)
    result = trainer.train(resume_from_checkpoint=True if last_checkpoint else None)
    if trainer.is_world_process_zero():
        logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        loss = logged[-1] if logged else result.training_loss
        print(f"final loss {loss!r} at step {trainer.state.global_step}", flush=True)
        if args.final_weights:
            save_final_weights(trainer.model.state_dict(), args.final_weights)
    if torch.distributed.is_initialized():
        # Every rank leaves together, gloo's threads get a moment without the GIL to free the
        # last collective, and the group goes before the interpreter does (torch 2.13, gloo;
        # the deadlock and the abort: docs/frameworks.md). Without any of it a rank of a
        # finished two-rank job aborted as it exited ("terminate called without an active
        # exception") in 5 runs of 8 (no tightrope attached) and torchrun restarted the job;
        # with destroy_process_group() alone it hung 2 runs of 6; with a barrier before it,
        # 1 run of 9 under tightrope exec; with this ending, 0 of 16.
        torch.distributed.barrier()
        time.sleep(0.1)
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
