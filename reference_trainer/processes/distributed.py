"""One process or many: the same code path, with torchrun's environment deciding which."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.inside import process_group


@dataclass(frozen=True, slots=True)
class Topology:
    """Where this process stands in the job."""

    rank: int
    world_size: int
    local_rank: int
    restart: int
    device: torch.device
    #: Failed tries at joining the process group before the one that worked.
    join_retries: int = 0

    @property
    def distributed(self) -> bool:
        """True when several ranks train together."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, which writes the shared files."""
        return self.rank == 0


def resolve_device(name: str, local_rank: int) -> torch.device:
    """``auto`` picks this rank's CUDA device when there is one, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(name)


def join(backend: str, dev: torch.device, restart: int, timeout: timedelta) -> int:
    """Join the default process group through torchrun's store; returns the failed tries
    (keys under a prefix per restart and try: see `harness.inside.process_group`)."""
    return process_group.join(
        dist.init_process_group,
        restart=restart,
        timeout=timeout,
        backend=backend,
        device_id=dev if dev.type == "cuda" else None,
    )


def init(device: str = "auto", timeout: float | None = None) -> Topology:
    """Join the process group when launched by torchrun (gloo on CPU, NCCL on CUDA).

    ``timeout`` bounds every collective (torch's default, 30 minutes, when None), so a rank
    that waits on a dead peer fails in bounded time instead of hanging.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dev = resolve_device(device, local_rank)
    retries = 0
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        limit = timedelta(seconds=timeout) if timeout is not None else timedelta(minutes=30)
        retries = join(backend, dev, restart, limit)
    return Topology(rank, world_size, local_rank, restart, dev, retries)


def barrier(topo: Topology) -> None:
    """Wait for every rank; a no-op in one process."""
    if topo.distributed:
        dist.barrier()


def mean_over_ranks(value: torch.Tensor, topo: Topology) -> torch.Tensor:
    """The mean of a scalar over all ranks."""
    if not topo.distributed:
        return value
    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / topo.world_size


def min_max_over_ranks(value: int, topo: Topology) -> tuple[int, int]:
    """The smallest and largest of an integer over all ranks (itself in one process)."""
    if not topo.distributed:
        return value, value
    both = torch.tensor([-value, value], dtype=torch.int64, device=topo.device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return int(-both[0]), int(both[1])


def shutdown(topo: Topology) -> None:
    """Leave the process group cleanly."""
    if topo.distributed and dist.is_initialized():
        dist.destroy_process_group()
