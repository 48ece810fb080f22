"""A job that behaves differently when forked from a warm interpreter: it looks, before its
own first import, whether ``torch._dynamo`` is already imported (a fresh ``python`` has not;
the zygote of ``tightrope crashpoints`` has), says so on stdout (``forked=True``/``False``)
and, forked, writes one file more (``forked.txt``). Otherwise a tiny loop saving
``ckpt.pt`` through a temporary file renamed into place.

``python tests/trainers/forked_differs.py --out DIR [--steps 2]``: resumes by itself from
``DIR/ckpt.pt``. The test that a forked fault-free run which does not leave what a fresh one
left makes every point run as fresh processes (`harness.crashpoints.warm`).
"""

from __future__ import annotations

import sys

FORKED = "torch._dynamo" in sys.modules  # before anything of this job imports torch

import argparse  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    print(f"forked={FORKED}", flush=True)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    os.makedirs(args.out, exist_ok=True)
    if FORKED:
        with open(os.path.join(args.out, "forked.txt"), "w") as f:
            f.write("started in a warm interpreter\n")
    ckpt = os.path.join(args.out, "ckpt.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        torch.save(state, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
