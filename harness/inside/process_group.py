"""Joining torchrun's process group again after a restart, without stale addresses.

torchrun's store outlives a restart, and ``init_process_group`` writes every rank's
address under the same keys each time: a restarted worker can read the address of a
worker that died with the last attempt and fail (``connectFullMesh ... Connection
refused``) or wait for it. Keys under a prefix of their own per restart and per try cannot
be stale; a try that fails anyway is retried with backoff.

The reference trainer joins through `join`. Under ``tightrope exec`` a trainer's own
``init_process_group()`` (env:// rendezvous, no store of its own) goes through it too
(`patch_init_process_group`), so a flaky restart of the launcher does not decide a
verdict about the trainer.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, default_pg_timeout
from torch.distributed.rendezvous import rendezvous

#: Tries at joining the process group before giving up.
JOIN_ATTEMPTS = 4
_BACKOFF = 0.5


def join(
    init: Callable[..., Any], *, restart: int, timeout: timedelta | None = None, **kwargs: Any
) -> int:
    """Join the default process group through torchrun's store with ``init`` (the real
    ``init_process_group``); returns the failed tries."""
    limit = timeout or default_pg_timeout
    for attempt in range(JOIN_ATTEMPTS):
        store, rank, world_size = next(rendezvous("env://", timeout=limit))
        store.set_timeout(limit)
        prefixed = PrefixStore(f"tightrope/restart-{restart}/try-{attempt}", store)
        try:
            init(store=prefixed, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
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
            time.sleep(_BACKOFF * 2**attempt)
    raise AssertionError("unreachable")


def patch_init_process_group() -> None:
    """Route ``torch.distributed.init_process_group`` of a worker that torchrun started,
    called the usual way (env://, no store), through `join` (once per process)."""
    import torch.distributed.distributed_c10d as c10d

    original = c10d.init_process_group
    if getattr(original, "_tightrope", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        given = dict(bound.arguments)
        plain = (
            given.get("store") is None
            and given.get("init_method") in (None, "env://")
            and "TORCHELASTIC_RESTART_COUNT" in os.environ
        )
        if not plain:
            return original(*args, **kwargs)
        for name in ("init_method", "store", "rank", "world_size"):
            given.pop(name, None)
        restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        join(original, restart=restart, **given)
        return None

    init_process_group._tightrope = True  # type: ignore[attr-defined]
    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


def broadcast_text(text: str, rank: int, world_size: int) -> str:
    """Rank 0's ``text`` on every rank (unchanged in a single process)."""
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return text
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    data = text.encode() if rank == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if rank == 0:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device or "cpu")
    else:
        buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if int(size.item()):
        dist.broadcast(buffer, src=0)
    return bytes(buffer.cpu().tolist()).decode()
