"""Training loops shaped the way frameworks run them, knowing nothing of tightrope.

``python tests/shaped_train.py --shape closure``: each step inside ``optimizer.step(closure)``
(Lightning's automatic optimization), forward and backward in the closure, gradients
clipped there, and each checkpoint ``torch.save``d into a ``BytesIO`` whose bytes go to a
temporary file renamed into place (Lightning's ``_atomic_save`` through fsspec).
``--shape state``: before training, a fresh optimizer is stepped once with zero gradients
and lr 0 to create its state (DCP's ``get_state_dict``), then the newest checkpoint is
loaded. ``--guard none``: a guard that sets every gradient to None when one is not finite
(the update then changes nothing); ``--guard zero``: one that zeroes them. Resumes from
``--out``'s ``last.pt`` when it exists.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_train import VOCAB, Net


def batch(step: int) -> torch.Tensor:
    """The batch of ``step`` (1-based), the same in every attempt."""
    gen = torch.Generator().manual_seed(step)
    return (torch.randint(0, VOCAB, (8, 1), generator=gen) + torch.arange(13)) % VOCAB


def save(state: dict[str, object], path: Path) -> None:
    """Into memory, then a temporary file renamed into place."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    fd, temp = tempfile.mkstemp(dir=path.parent)
    os.close(fd)
    with open(temp, "wb") as f:
        f.write(buffer.getvalue())
    os.replace(temp, path)


def guard(model: torch.nn.Module, how: str) -> None:
    """A non-finite gradient: drop (None) or zero every gradient."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if how == "off" or all(bool(torch.isfinite(g).all()) for g in grads):
        return
    for p in model.parameters():
        if how == "none":
            p.grad = None
        elif p.grad is not None:
            p.grad.zero_()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=["closure", "state", "plain"], default="plain")
    parser.add_argument("--guard", choices=["off", "none", "zero"], default="off")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if args.shape == "state":
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.param_groups[0]["lr"] = 0.0
        optimizer.step()
        optimizer.param_groups[0]["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
    start = 0
    last = args.out / "last.pt"
    if last.exists():
        state = torch.load(last)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    for step in range(start + 1, args.steps + 1):
        tokens = batch(step)

        def closure(tokens: torch.Tensor = tokens) -> torch.Tensor:
            optimizer.zero_grad()
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
            )
            loss.backward()
            guard(model, args.guard)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            return loss

        if args.shape == "closure":
            loss = optimizer.step(closure)
        else:
            loss = closure()
            optimizer.step()
        if args.save_every and step % args.save_every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            save({**state, "step": step}, last)
    print(f"final loss {float(loss)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
