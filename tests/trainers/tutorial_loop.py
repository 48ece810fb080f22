"""A training loop in the style of PyTorch's "Optimizing Model Parameters" tutorial.

DataLoader over a TensorDataset, ``loss_fn = nn.CrossEntropyLoss()``, AdamW, and the tutorial's
``pred = model(X); loss = loss_fn(pred, y); loss.backward(); optimizer.step();
optimizer.zero_grad()`` order, looping over epochs until ``--steps`` iterations are done.

``python tests/trainers/tutorial_loop.py --steps 60 [--seed 0] [--guard] [--clip 1.0]
[--clip-strict]``. Prints ``step N loss X`` every 10 steps and ``final loss <repr>``.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, WIDTH, SEQ = 32, 16, 12


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + torch.tanh(self.attn(x))
        return x + torch.relu(self.mlp(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


def make_data(n: int, generator: torch.Generator) -> TensorDataset:
    """Synthetic next-token data: each token follows the last, mod VOCAB."""
    start = torch.randint(0, VOCAB, (n, 1), generator=generator)
    tokens = (start + torch.arange(SEQ + 1)) % VOCAB
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--guard", action="store_true", help="skip steps with non-finite grads")
    parser.add_argument("--clip", type=float, default=None, metavar="NORM")
    parser.add_argument(
        "--clip-strict", action="store_true", help="clip (to --clip or 1.0), skip if non-finite"
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    dataset = make_data(256, generator)
    train_dataloader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, generator=generator
    )
    model = TinyLM()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    model.train()
    step, loss_value = 0, math.nan
    while step < args.steps:
        for X, y in train_dataloader:
            if step >= args.steps:
                break
            step += 1
            pred = model(X)
            loss = loss_fn(pred.reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            loss_value = loss.item()

            if args.guard and not all(
                torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None
            ):
                print(f"skipping step {step}: non-finite gradient", flush=True)
                optimizer.zero_grad()
                continue
            if args.clip_strict:
                try:
                    torch.nn.utils.clip_grad_norm_(
                        model.parameters(), args.clip or 1.0, error_if_nonfinite=True
                    )
                except RuntimeError:
                    print(f"skipping step {step}: non-finite gradient norm", flush=True)
                    optimizer.zero_grad()
                    continue
            elif args.clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)

            optimizer.step()
            optimizer.zero_grad()

            if step % 10 == 0:
                print(f"step {step} loss {loss_value:>7f}", flush=True)

    print(f"final loss {loss_value!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
