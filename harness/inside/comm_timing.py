"""Time spent in gradient all-reduces, per step, for the microscope.

Two doors, both optional: a DDP communication hook (the default all-reduce, timed from
launch to completion of each bucket) on a `DistributedDataParallel` model the agent was
shown, and a wrapper around ``torch.distributed.all_reduce`` for trainers that average
their gradients by hand. Bucket all-reduces overlap with backward and with each other: the
figure is the sum of their times in flight, the number a communication trace shows.

The DDP hook stays in the model (``DistributedDataParallel`` keeps it in ``_comm_hooks``):
a copy of the model (``copy.deepcopy``, pickling) gets torch's own ``allreduce_hook`` in
its place, which averages as the timed one does and knows nothing of the agent.
"""

from __future__ import annotations

import copy
import functools
import inspect
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook


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
        try:
            model.register_comm_hook(None, TimedAllReduce(self))  # type: ignore[operator]
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


class TimedAllReduce:
    """A DDP communication hook: the default all-reduce, each bucket's time counted by
    ``timer``. Copies and pickles as torch's ``allreduce_hook``."""

    # DDP checks a hook's parameter names, and its annotations against the classes; under
    # `from __future__ import annotations` these are strings, so it is shown none.
    __signature__ = inspect.Signature(
        [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for name in ("state", "bucket")
        ]
    )

    def __init__(self, timer: CommTimer) -> None:
        self.timer = timer
        # DDP reads a hook's names, as a function has them (and logs the qualified one).
        self.__name__ = self.__qualname__ = type(self).__name__

    def __call__(self, state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        started = time.perf_counter()

        def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            self.timer.add((time.perf_counter() - started) * 1000.0)
            return f.value()

        return allreduce_hook(state, bucket).then(done)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return allreduce_hook

    def __reduce__(self) -> tuple[Any, ...]:
        # copy.copy of a function is the function: an identity that pickles by name, so
        # the pickle names torch's hook and nothing of tightrope.
        return (copy.copy, (allreduce_hook,))
