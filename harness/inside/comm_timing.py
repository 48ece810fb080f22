"""Time spent in gradient all-reduces, per step, for the microscope.

Two doors, both optional: a DDP communication hook (the default all-reduce, timed from
launch to completion of each bucket) on a `DistributedDataParallel` model the agent was
shown, and a wrapper around ``torch.distributed.all_reduce`` for trainers that average
their gradients by hand. Bucket all-reduces overlap with backward and with each other: the
figure is the sum of their times in flight, the number a communication trace shows.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class CommTimer:
    """Sums the milliseconds of the all-reduces that finish between two `take` calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # bucket futures complete on the backend's threads
        self._ms = 0.0
        self._seen = False
        self._original: Any = None
        self.hooked_ddp = False

    def add(self, ms: float) -> None:
        """Count one all-reduce."""
        with self._lock:
            self._ms += ms
            self._seen = True

    def take(self) -> float:
        """Milliseconds since the last call (NaN when no all-reduce was seen)."""
        with self._lock:
            ms, seen = self._ms, self._seen
            self._ms, self._seen = 0.0, False
        return ms if seen else float("nan")

    def hook_ddp(self, model: nn.Module) -> str | None:
        """Time ``model``'s bucket all-reduces; the reason when it cannot (a trainer's own
        communication hook is already in place)."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def timed(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
            started = time.perf_counter()
            future = allreduce_hook(state, bucket)

            def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                self.add((time.perf_counter() - started) * 1000.0)
                return f.value()

            return future.then(done)

        # DDP checks a hook's annotations against the classes; here they are strings.
        timed.__annotations__ = {}
        try:
            model.register_comm_hook(None, timed)  # type: ignore[operator]
        except (RuntimeError, ValueError, AssertionError) as exc:
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.hooked_ddp = True
        return None

    def wrap_all_reduce(self) -> None:
        """Time ``torch.distributed.all_reduce`` calls (synchronous ones; an ``async_op``
        call is timed to its return)."""
        if self._original is not None:
            return
        original = self._original = dist.all_reduce

        @functools.wraps(original)
        def all_reduce(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add((time.perf_counter() - started) * 1000.0)

        dist.all_reduce = all_reduce

    def unwrap(self) -> None:
        """Put ``torch.distributed.all_reduce`` back."""
        if self._original is not None:
            dist.all_reduce = self._original
            self._original = None
