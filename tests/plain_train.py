"""A plain PyTorch training script that knows nothing of tightrope (the attach tests' subject).

Alone: ``python tests/plain_train.py --steps 8``; under torchrun it trains with DDP on gloo.
Prints ``final loss <repr>`` (rank 0) so runs can be compared bit for bit.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, WIDTH = 32, 16


class Block(nn.Module):
    """A residual block with ``attn`` and ``mlp`` sub-layers (plain Linears)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + torch.tanh(self.attn(x))
        return x + torch.relu(self.mlp(x))


class Net(nn.Module):
    """Embedding, ``blocks.0``/``blocks.1``, head: next-token logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exit-code", type=int, default=0, help="exit with this code at the end")
    args = parser.parse_args()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(args.seed)
    model = Net()
    net = DDP(model) if world > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(args.seed + rank)
    loss = torch.tensor(0.0)
    for _ in range(args.steps):
        start = torch.randint(0, VOCAB, (8, 1), generator=gen)
        tokens = (start + torch.arange(13)) % VOCAB  # learnable: each token follows the last
        logits = net(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"final loss {loss.item()!r}", flush=True)
    if world > 1:
        # gloo's threads idle (a barrier, and a moment to free it) before the group goes:
        # torch 2.13's destructor can deadlock with them on the GIL (docs/frameworks.md).
        dist.barrier()
        time.sleep(0.1)
        dist.destroy_process_group()
        # Collect the process group's objects now: left to interpreter exit, gloo's threads
        # sometimes abort the process ("terminate called without an active exception").
        gc.collect()
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
