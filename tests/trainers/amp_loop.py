"""A mixed-precision training loop in the style of PyTorch's "Automatic Mixed Precision" recipe.

``torch.autocast`` (bfloat16 on CPU) around the forward pass and a ``torch.amp.GradScaler``, with
the recipe's order: ``zero_grad(set_to_none=True)``; forward under autocast;
``scaler.scale(loss).backward()``; ``scaler.unscale_(optimizer)``; ``clip_grad_norm_(..., 1.0)``;
``scaler.step(optimizer)``; ``scaler.update()``. The scaler skips steps whose gradients are not
finite and halves its scale.

``python tests/trainers/amp_loop.py --steps 60 [--seed 0] [--no-scaler]``: ``--no-scaler`` is the
plain, unguarded ``loss.backward(); clip; optimizer.step()``. Prints ``step N loss X`` every 10
steps and ``final loss <repr>``.
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
    parser.add_argument("--steps", type=int, default=60, help="optimizer iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--no-scaler", action="store_true", help="plain backward/clip/step")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = TinyLM()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=10)

    loss = torch.tensor(float("nan"))
    for step in range(1, args.steps + 1):
        inputs, targets = get_batch(args.batch_size, generator)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(inputs)
            loss = criterion(logits.reshape(-1, VOCAB), targets.reshape(-1))

        if args.no_scaler:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()

        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)

    print(f"final loss {loss.item()!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
