"""A tiny trainer and the checks of tests/test_no_side_effects.py, shared by the in-process
tests and by the script that ``tightrope exec`` runs.

Run as a script (``python tests/side_effects_support.py``) it trains, runs every check and
prints one JSON object: each check's outcome, the losses (as hex floats, to compare bit
for bit) and the state-dict keys. It imports nothing of tightrope, so it is a trainer that
knows nothing of it; under ``tightrope exec`` the run dir is in ``TIGHTROPE_RUN_DIR``.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

#: Optimizer steps trained before the checks; they run mid-way through the next step,
#: after its forward (a fault armed for that step has its hooks in, nothing fired yet).
STEPS = 4
IN, OUT = 8, 4
#: The backend the compile check uses: inductor needs a C++ compiler and tens of seconds on
#: CPU; aot_eager still traces forward and backward through AOTAutograd.
COMPILE_BACKEND = "aot_eager"


def make_model() -> nn.Sequential:
    """The seeded model (a Sequential, as in the reported crash)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(IN, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, OUT)
    )


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW: its state dict has per-parameter state, not only param groups."""
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The seeded batches, one per step (and one more)."""
    gen = torch.Generator().manual_seed(1)
    while True:
        yield torch.randn(6, IN, generator=gen), torch.randn(6, OUT, generator=gen)


def loss_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean squared error on one batch."""
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def probe_input() -> torch.Tensor:
    """An input the checks run the model (and its copies) on."""
    return torch.randn(3, IN, generator=torch.Generator().manual_seed(2))


@dataclass
class Trained:
    """A model trained `STEPS` steps and half-way through one more."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    losses: list[torch.Tensor]
    """Every step's loss, the open step's too."""
    run_dir: Path | None
    """Where tightrope writes (None without it)."""


def train(
    model: nn.Module, optimizer: torch.optim.Optimizer, run_dir: Path | None = None
) -> Trained:
    """`STEPS` plain steps, then the forward of the next: the trainer under test."""
    data = batches()
    losses = []
    for _ in range(STEPS):
        loss = loss_of(model, next(data))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    losses.append(loss_of(model, next(data)).detach().clone())  # the open step
    return Trained(model, optimizer, losses, run_dir)


# -- what a tightrope hook may be in a copy ---------------------------------------------------


def hooks_of(model: nn.Module) -> list[object]:
    """Every hook on ``model``'s modules and parameters."""
    found: list[object] = []
    for module in model.modules():
        for name, value in vars(module).items():
            if name.startswith("_") and name.endswith("hooks") and isinstance(value, dict):
                found += value.values()
        for param in module.parameters(recurse=False):
            for name in ("_backward_hooks", "_post_accumulate_grad_hooks"):
                found += (getattr(param, name, None) or {}).values()
    return found


def live(hook: object) -> bool:
    """True for a hook of tightrope's other than the inert stand-in copies carry."""
    module = getattr(hook, "__module__", None) or type(hook).__module__
    return module.split(".")[0] in ("harness", "faults") and type(hook).__name__ != "Inert"


def files_of(run_dir: Path | None) -> dict[str, int]:
    """Size of every file tightrope wrote (nothing without a run dir)."""
    if run_dir is None or not run_dir.exists():
        return {}
    return {str(p): p.stat().st_size for p in sorted(run_dir.rglob("*")) if p.is_file()}


def runs(model: nn.Module, like: nn.Module, run_dir: Path | None) -> None:
    """``model`` (a copy or a load of ``like``) computes what ``like`` does, and its forward
    writes nothing to the run dir (no agent hook went with it); its backward works."""
    x = probe_input()
    with torch.no_grad():
        expected = like(x)
    before = files_of(run_dir)
    out = model(x)
    assert files_of(run_dir) == before, "its forward wrote to the run dir: a live agent hook"
    assert torch.equal(out, expected), "it computes something else"
    out.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters()), "the copy has no gradients"


# -- the checks -------------------------------------------------------------------------------


def check_torch_save(t: Trained) -> None:
    """``torch.save(model)`` leaves the model's hooks as they were, and ``torch.load`` gives
    a model that runs; the bytes hold nothing of tightrope (a process without it loads
    them)."""
    buffer = io.BytesIO()
    hooks = hooks_of(t.model)
    torch.save(t.model, buffer)
    assert hooks_of(t.model) == hooks, "the save left the model's hooks changed"
    data = buffer.getvalue()
    assert b"harness" not in data and b"faults" not in data, "the file names tightrope"
    loaded = torch.load(io.BytesIO(data), weights_only=False)
    assert not [h for h in hooks_of(loaded) if live(h)], "the loaded model has live hooks"
    runs(loaded, t.model, t.run_dir)


def check_pickle(t: Trained) -> None:
    """``pickle.dumps(model)`` works; what it loads runs and carries no live hook."""
    loaded = pickle.loads(pickle.dumps(t.model))
    assert not [h for h in hooks_of(loaded) if live(h)], "the unpickled model has live hooks"
    runs(loaded, t.model, t.run_dir)


def check_deepcopy(t: Trained) -> None:
    """``copy.deepcopy(model)`` (an EMA copy) runs and carries no live agent hook."""
    twin = copy.deepcopy(t.model)
    shared = {id(h) for h in hooks_of(t.model)}  # a closure copies as itself, state and all
    hooks = [h for h in hooks_of(twin) if live(h) or id(h) in shared]
    assert not hooks, f"the copy carries live hooks: {hooks}"
    runs(twin, t.model, t.run_dir)
    twin_opt = copy.deepcopy(t.optimizer)
    assert twin_opt.state_dict().keys() == t.optimizer.state_dict().keys()


def check_compile(t: Trained) -> None:
    """``torch.compile(model)`` runs forward and backward and computes what eager does."""
    compiled = torch.compile(t.model, backend=COMPILE_BACKEND)
    x = probe_input()
    with torch.no_grad():
        expected = t.model(x)
    out = compiled(x)
    assert torch.allclose(out, expected), "the compiled model computes something else"
    t.optimizer.zero_grad()
    out.square().mean().backward()
    assert all(p.grad is not None for p in t.model.parameters())


def state_keys(t: Trained) -> dict[str, list[str]]:
    """The model's state-dict keys (in order) and the optimizer's, as a trainer saves them."""
    opt = t.optimizer.state_dict()
    return {
        "model": list(t.model.state_dict()),
        "optimizer": sorted(opt),
        "optimizer.param_groups": [sorted(g) for g in opt["param_groups"]],
        "optimizer.state": [sorted(s) for s in opt["state"].values()],
    }


CHECKS: dict[str, Callable[[Trained], None]] = {
    "torch_save": check_torch_save,
    "pickle": check_pickle,
    "deepcopy": check_deepcopy,
    "compile": check_compile,
}


def main() -> int:
    """Train, run every check, print the outcome as JSON (one line)."""
    run_dir = os.environ.get("TIGHTROPE_RUN_DIR")
    model = make_model()
    trained = train(model, make_optimizer(model), Path(run_dir) if run_dir else None)
    result: dict[str, object] = {
        "losses": [float(loss).hex() for loss in trained.losses],
        "state_keys": state_keys(trained),
    }
    for name, check in CHECKS.items():
        try:
            check(trained)
            result[name] = "ok"
        except Exception as exc:
            result[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
