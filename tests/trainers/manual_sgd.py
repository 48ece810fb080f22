"""A hand-written SGD loop with no ``torch.optim``, in the style of PyTorch's "Learning PyTorch
with Examples" (``nn`` module) tutorial.

``loss.backward()``, then ``with torch.no_grad(): p -= lr * p.grad`` for each parameter (or, with
``--data-update``, the older ``p.data.add_(p.grad.data, alpha=-lr)``), then ``model.zero_grad()``.

``python tests/trainers/manual_sgd.py --steps 60 [--seed 0] [--lr 0.5] [--data-update] [--guard]``:
``--guard`` skips the update when the loss or any gradient is not finite. Prints ``step N loss X``
every 10 steps and ``final loss <repr>``.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

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


def get_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic next-token data: each token follows the last, mod VOCAB."""
    start = torch.randint(0, VOCAB, (batch_size, 1), generator=generator)
    tokens = (start + torch.arange(SEQ + 1)) % VOCAB
    return tokens[:, :-1], tokens[:, 1:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="update iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--data-update", action="store_true", help="update through p.data")
    parser.add_argument("--guard", action="store_true", help="skip non-finite loss/gradients")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = TinyLM()
    loss_fn = nn.CrossEntropyLoss()
    lr = args.lr

    loss = torch.tensor(float("nan"))
    for step in range(1, args.steps + 1):
        x, y = get_batch(args.batch_size, generator)
        y_pred = model(x)
        loss = loss_fn(y_pred.reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()

        if args.guard and not (
            torch.isfinite(loss)
            and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        ):
            print(f"skipping step {step}: non-finite loss or gradient", flush=True)
            model.zero_grad()
            continue

        if args.data_update:
            for p in model.parameters():
                p.data.add_(p.grad.data, alpha=-lr)
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
        model.zero_grad()

        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)

    print(f"final loss {loss.item()!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
