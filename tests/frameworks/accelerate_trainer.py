"""A plain training loop with 🤗 Accelerate, as its examples write one (complete_nlp_example.py):
``accelerator.prepare`` the model, optimizer and dataloader, ``accelerator.backward(loss)``,
``accelerator.clip_grad_norm_``, ``accelerator.save_state(f"step_{N}")`` every ``--save-every``
steps, and on a new start ``accelerator.load_state`` of the newest ``step_N`` folder with
``accelerator.skip_first_batches`` for the batches that epoch already trained.

``python tests/frameworks/accelerate_trainer.py --steps 30 --save-every 8 [--out DIR]
[--guard]`` (``accelerate launch`` or torchrun for several processes). The model is a tiny
GPT-style network of plain PyTorch. ``--guard`` skips ``optimizer.step()`` when the
gradient norm ``clip_grad_norm_`` returns is not finite. Prints ``final loss <repr> at step N``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, WIDTH, SEQ, BATCH, BATCHES_PER_EPOCH = 64, 32, 16, 4, 10


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(WIDTH, 2, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH)
        )
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        x = self.embed(idx) + self.pos(torch.arange(t))  # (B, T, C)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)  # (B, T, vocab)


def counting_data(seed: int) -> TensorDataset:
    """Sequences in which each token follows the last (mod VOCAB); targets shifted by one."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (BATCHES_PER_EPOCH * BATCH, 1), generator=generator)
    tokens = (start + torch.arange(SEQ + 1)) % VOCAB
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=8)
    parser.add_argument("--out", default=".", help="step_N/ folders go to OUT/ckpt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--guard", action="store_true", help="skip steps with a non-finite grad norm"
    )
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    set_seed(args.seed)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_dataloader = DataLoader(counting_data(args.seed), batch_size=BATCH, shuffle=False)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)

    ckpt_dir = Path(args.out) / "ckpt"
    overall_step = 0
    saved = sorted(ckpt_dir.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    if saved:
        accelerator.print(f"Resumed from checkpoint: {saved[-1]}")
        accelerator.load_state(saved[-1])
        overall_step = int(saved[-1].name.split("_")[1])

    model.train()
    loss = torch.tensor(float("nan"))
    while overall_step < args.steps:
        resume_step = overall_step % len(train_dataloader)
        batches = train_dataloader
        if resume_step:
            batches = accelerator.skip_first_batches(train_dataloader, resume_step)
        for inputs, targets in batches:
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            accelerator.backward(loss)
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
            if args.guard and not torch.isfinite(grad_norm):
                accelerator.print(f"non-finite grad norm at step {overall_step + 1}; step skipped")
            else:
                optimizer.step()
            optimizer.zero_grad()
            overall_step += 1
            if overall_step % args.save_every == 0:
                accelerator.save_state(ckpt_dir / f"step_{overall_step}")
            if overall_step >= args.steps:
                break
    accelerator.print(f"final loss {loss.item()!r} at step {overall_step}")
    # end_training() destroys the gloo process group torchrun made it create, and torch
    # 2.13 + gloo can deadlock as a group is freed (docs/frameworks.md): one baseline run of
    # this script hung to its timeout in a full test run. So the last collective ends
    # first, and gloo's threads get a moment without the GIL, as in the other trainers here.
    accelerator.wait_for_everyone()
    time.sleep(0.1)
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
