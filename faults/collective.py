"""Collective faults: one rank's all-reduces fail or stop being entered.

``collective_fail``: the rank's next all-reduce raises a ``DistBackendError`` (what a
backend raises when a peer or the link is gone), once at each step the fault fires.
``collective_hang``: the rank stops entering all-reduces: its next call blocks (for good,
or ``resume_after`` seconds) while the process stays alive, so a process-level check sees
nothing wrong; the other ranks wait in the collective it never joined.

Both act by wrapping ``torch.distributed.all_reduce`` on the target rank for the step
(`AllReduceTap`, shared with `faults.slow`'s ``slow_link``): the calls a trainer makes by
hand, and DDP's bucket all-reduces where the model's communication hook goes through
``torch.distributed.all_reduce`` (torch's ``allreduce_hook`` does; tightrope's microscope
installs a timed one). The wrapper is installed before the forward pass and removed when
the step ends; it is journaled once installed (the fault is armed on that rank).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from faults.bias import Bias
from faults.injector import Injection, Injector, StepContext
from faults.spec import FaultClass, FaultSpec


def _dist() -> Any:
    """``torch.distributed``, imported when a fault first acts."""
    import torch.distributed

    return torch.distributed


class AllReduceTap:
    """Wraps ``torch.distributed.all_reduce`` in one process while armed: ``before`` runs
    before each call (it may sleep, raise or block). Removing it puts the previous
    function back when nothing wrapped it since; otherwise the wrapper stays, inert."""

    def __init__(self, before: Callable[[], None]) -> None:
        self.before = before
        self.armed = False
        self.calls = 0
        self._original: Any = None
        self._wrapper: Any = None
        self._lock = threading.Lock()

    def install(self) -> None:
        """Wrap the current ``all_reduce``."""
        dist = _dist()
        if self.armed:
            return
        original = self._original = dist.all_reduce

        @functools.wraps(original)
        def all_reduce(*args: Any, **kwargs: Any) -> Any:
            if self.armed:
                with self._lock:
                    self.calls += 1
                self.before()
            return original(*args, **kwargs)

        self._wrapper = all_reduce
        dist.all_reduce = all_reduce
        self.armed = True

    def remove(self) -> None:
        """Disarm; unwrap when this wrapper is still the outermost."""
        self.armed = False
        dist = _dist()
        if self._wrapper is not None and dist.all_reduce is self._wrapper:
            dist.all_reduce = self._original
        self._wrapper = self._original = None


def backend_error(message: str) -> Exception:
    """A ``DistBackendError`` (a ``RuntimeError`` where this torch lacks it)."""
    error = getattr(_dist(), "DistBackendError", RuntimeError)
    try:
        return error(message)
    except TypeError:
        return RuntimeError(message)


class CollectiveFaultSpec(FaultSpec):
    """Fields the collective kinds share."""

    fault_class: ClassVar[FaultClass] = "process"


class CollectiveFailSpec(CollectiveFaultSpec):
    """The target rank's next all-reduce at the step raises."""

    kind: Literal["collective_fail"] = "collective_fail"
    description: ClassVar[str] = (
        "A rank's all-reduce raises DistBackendError at a step (a broken collective)."
    )


class CollectiveHangSpec(CollectiveFaultSpec):
    """The target rank stops entering all-reduces, alive."""

    kind: Literal["collective_hang"] = "collective_hang"
    description: ClassVar[str] = (
        "A rank stops entering collectives, its process alive (a hang only a "
        "collective watchdog names)."
    )
    resume_after: Annotated[float | None, Bias((0.5, 2.0), upto=60)] = Field(
        default=None,
        gt=0,
        description="Enter the collective after this many seconds; never when unset.",
    )


class CollectiveFailInjector(Injector[CollectiveFailSpec]):
    """Arms a tap whose first call raises."""

    def __init__(self, spec: CollectiveFailSpec) -> None:
        super().__init__(spec)
        self.tap = AllReduceTap(self._raise)
        self._rank = self._step = -1

    def _raise(self) -> None:
        self.tap.armed = False  # once
        raise backend_error(
            f"tightrope collective_fail: all_reduce failed on rank {self._rank} "
            f"(injected at step {self._step})"
        )

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        """Arm the failure on this rank."""
        if ctx.rank not in self.spec.target_ranks(ctx.world_size):
            return []
        self._rank, self._step = ctx.rank, ctx.step
        self.tap.install()
        details = {"rank": ctx.rank, "collective": "all_reduce", "raises": "DistBackendError"}
        return [Injection(fault=self.spec.kind, target=f"rank {ctx.rank}", details=details)]

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Disarm (a step with no all-reduce left it unused)."""
        self.tap.remove()
        return []


class CollectiveHangInjector(Injector[CollectiveHangSpec]):
    """Arms a tap whose first call blocks; the process stays alive and responsive to
    signals (it sleeps in short naps)."""

    def __init__(self, spec: CollectiveHangSpec) -> None:
        super().__init__(spec)
        self.tap = AllReduceTap(self._block)

    def _block(self) -> None:
        self.tap.armed = False  # the calls after it (if it ever returns) go through
        limit = self.spec.resume_after
        end = None if limit is None else time.monotonic() + limit
        while end is None or time.monotonic() < end:
            time.sleep(0.05)

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        """Arm the hang on this rank."""
        if ctx.rank not in self.spec.target_ranks(ctx.world_size):
            return []
        self.tap.install()
        details = {
            "rank": ctx.rank,
            "collective": "all_reduce",
            "resume_after": self.spec.resume_after,
        }
        return [Injection(fault=self.spec.kind, target=f"rank {ctx.rank}", details=details)]

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Disarm, when the step ends at all."""
        self.tap.remove()
        return []
