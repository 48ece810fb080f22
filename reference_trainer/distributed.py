"""One process or many: the same code path, with torchrun's environment deciding which."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore
from torch.distributed.rendezvous import rendezvous

#: Tries at joining the process group before giving up (see `join`).
JOIN_ATTEMPTS = 4
_JOIN_BACKOFF = 0.5


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
    """Join the default process group through torchrun's store; returns the failed tries.

    torchrun's store outlives a restart, and the process group writes every rank's address
    under the same keys each time: a restarted worker could read the address of a worker
    that died with the last attempt and fail with ``connectFullMesh ... Connection
    refused``. Keys under a prefix of their own per restart and per try cannot be stale;
    a try that fails anyway is retried with backoff.
    """
    for attempt in range(JOIN_ATTEMPTS):
        store, rank, world_size = next(rendezvous("env://", timeout=timeout))
        store.set_timeout(timeout)
        prefixed = PrefixStore(f"tightrope/restart-{restart}/try-{attempt}", store)
        try:
            dist.init_process_group(
                backend=backend,
                store=prefixed,
                rank=rank,
                world_size=world_size,
                timeout=timeout,
                device_id=dev if dev.type == "cuda" else None,
            )
            return attempt
        except (RuntimeError, dist.DistError) as exc:
            if attempt == JOIN_ATTEMPTS - 1:
                raise
            print(
                f"[rank {rank}] joining the process group failed ({exc}); "
                f"retry {attempt + 1} of {JOIN_ATTEMPTS - 1}",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(_JOIN_BACKOFF * 2**attempt)
    raise AssertionError("unreachable")


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


def shutdown(topo: Topology) -> None:
    """Leave the process group cleanly."""
    if topo.distributed and dist.is_initialized():
        dist.destroy_process_group()
