"""What the agent needs to know of a trainer it did not write: its model inside wrappers,
its rank, how it exits, its gradients' norm, the token tensor in its batches."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn

B = TypeVar("B")


#: Wrappers (DDP, DataParallel, torch.compile) that hold the user's model, and where.
WRAPPERS = {
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "OptimizedModule": "_orig_mod",
}


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DDP, DataParallel or torch.compile wrappers (names as the user's)."""
    while (attr := WRAPPERS.get(type(model).__name__)) and isinstance(
        inner := getattr(model, attr, None), nn.Module
    ):
        model = inner
    return model


def data_parallel(model: nn.Module) -> nn.Module | None:
    """The DistributedDataParallel wrapper among ``model``'s wrappers, if there is one."""
    while (attr := WRAPPERS.get(type(model).__name__)) and isinstance(
        inner := getattr(model, attr, None), nn.Module
    ):
        if type(model).__name__ == "DistributedDataParallel":
            return model
        model = inner
    return None


def topology(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): given, else torch.distributed's, else env RANK/WORLD_SIZE, else 0/1."""
    joined = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if joined else int(os.environ.get("RANK", "0"))
    if world_size is None:
        world_size = dist.get_world_size() if joined else int(os.environ.get("WORLD_SIZE", "1"))
    return rank, world_size


def restart_count() -> int:
    """How many times torchrun restarted the workers (0 outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


exit_statuses: list[SystemExit] = []  # the last sys.exit call, for the atexit hook


def watch_exit() -> None:
    """Wrap ``sys.exit`` (once) to note its status: atexit cannot see why Python exits."""
    original = sys.exit
    if getattr(original, "_tightrope", False):
        return

    def exit(status: Any = None) -> NoReturn:
        exit_statuses[:] = [SystemExit(status)]
        original(status)

    exit._tightrope = True  # type: ignore[attr-defined]
    sys.exit = exit


def grad_norm(params: Iterable[torch.Tensor]) -> float | None:
    """Global L2 norm of the gradients of ``params``; None when none has a gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    with torch.no_grad():
        return float(torch.nn.utils.get_total_norm(grads))


def first_tensor(batch: object) -> torch.Tensor | None:
    """The token tensor of ``batch``, where `replace_first` finds it; None when none is."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    if isinstance(batch, Mapping) and isinstance(ids := batch.get("input_ids"), torch.Tensor):
        return ids
    return None


def replace_first(batch: B, through: Callable[[torch.Tensor], torch.Tensor]) -> B:
    """``batch`` with its token tensor passed ``through``: the batch itself when a tensor,
    the first item of a tuple/list, or ``input_ids`` of a mapping (copied as a dict)."""
    if isinstance(batch, torch.Tensor):
        return cast(B, through(batch))
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        first = through(batch[0])
        if first is batch[0]:
            return batch
        items = [first, *batch[1:]]
        return cast(B, type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items))
    if isinstance(batch, Mapping) and isinstance(ids := batch.get("input_ids"), torch.Tensor):
        new = through(ids)
        return batch if new is ids else cast(B, {**batch, "input_ids": new})
    return batch
