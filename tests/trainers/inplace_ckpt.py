"""A loop that saves the way many scripts do, and so breaks when killed mid-save: the
checkpoint written in place (``torch.save`` straight to ``ckpt.pt``, no temporary file, no
rename), then a ``latest`` marker (JSON, written in place too) naming the step, which a
resume trusts.

``python tests/trainers/inplace_ckpt.py --out DIR [--steps 4] [--every 2] [--seed 0]``:
resumes by itself when ``DIR/latest`` exists (loads ``ckpt.pt`` with weights_only=True and
goes on from the step ``latest`` names). The negative control of ``tightrope crashpoints``:
a torn ``ckpt.pt`` or ``latest`` makes the resume raise (HARD_FAIL).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch import nn


def batch(seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step``: the same whatever the run resumed from."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    os.makedirs(args.out, exist_ok=True)
    ckpt, latest = os.path.join(args.out, "ckpt.pt"), os.path.join(args.out, "latest")
    start = 0
    if os.path.exists(latest):
        with open(latest) as f:
            start = json.load(f)["step"]
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    for step in range(start + 1, args.steps + 1):
        x, y = batch(args.seed, step)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, ckpt)
            with open(latest, "w") as f:
                json.dump({"step": step, "note": "saved in place"}, f)
    print(f"trained to step {args.steps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
