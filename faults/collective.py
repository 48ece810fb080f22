"""Collective faults: one rank's collectives fail or stop being entered.

``collective_fail``: the rank's next collective raises a ``DistBackendError`` (what a
backend raises when a peer or the link is gone), once at each step the fault fires.
``collective_hang``: the rank stops entering collectives: its next call blocks (for good,
or ``resume_after`` seconds) while the process stays alive, so a process-level check sees
nothing wrong; the other ranks wait in the collective it never joined.

Both act by wrapping the ``torch.distributed`` collectives trainers call (`COLLECTIVES`:
``all_reduce``, ``broadcast``, ``all_gather``, ``all_gather_into_tensor``,
``reduce_scatter``, ``reduce_scatter_tensor``, ``barrier``, and the ``*_single`` names
torch 2.13 gives the tensor forms) on the target rank for the
step (`CollectiveTap`, shared with `faults.slow`'s ``slow_link``): the calls a trainer
makes through ``torch.distributed``, and DDP's bucket all-reduces where the model's
communication hook goes through ``torch.distributed.all_reduce`` (torch's
``allreduce_hook`` does; tightrope's microscope installs a timed one). A name bound
before the tap went in (``from torch.distributed import all_reduce``) and the calls
torch makes inside its own module (``all_gather_object`` through ``all_gather``) are
not reached. The wrappers are installed before the forward pass and removed when the
step ends, each original put back as it was; with no fault due, nothing is wrapped. The
fault is journaled once installed (armed on that rank).
"""

from __future__ import annotations

import functools
import importlib
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from faults.bias import Bias
from faults.injector import Injection, Injector, StepContext
from faults.spec import FaultClass, FaultSpec

#: The ``torch.distributed`` collectives a tap wraps.
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",  # (the new name of all_gather_into_tensor)
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",  # (the new name of reduce_scatter_tensor)
    "barrier",
)


def _dist() -> Any:
    """``torch.distributed``, imported when a fault first acts."""
    import torch.distributed

    return torch.distributed


def _plain(module: str, name: str) -> Any:
    """The function ``name`` of ``module`` (what a wrapped collective pickles as)."""
    return getattr(importlib.import_module(module), name)


class TappedCollective:
    """One wrapped collective: the tap's ``before`` while it is armed, then the original.
    Copies and pickles as the original function, so an object of the trainer's that holds
    it (a ``functools.partial``) keeps pickling."""

    def __init__(self, tap: CollectiveTap, name: str, original: Callable[..., Any]) -> None:
        functools.update_wrapper(self, original)
        self.tap, self.name, self.original = tap, name, original

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.tap.entering(self.name)
        return self.original(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        original = self.original
        return (_plain, (original.__module__, original.__qualname__))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self.original


class CollectiveTap:
    """Wraps the `COLLECTIVES` of ``torch.distributed`` in one process while armed:
    ``before(name)`` runs before each call (it may sleep, raise or block). Removing it
    puts each previous function back when nothing wrapped it since; otherwise that
    wrapper stays, inert."""

    def __init__(self, before: Callable[[str], None]) -> None:
        self.before = before
        self.armed = False
        self.calls = 0
        #: The collectives called while armed, in order (at most 100 kept).
        self.seen: list[str] = []
        self._wrappers: dict[str, TappedCollective] = {}
        self._lock = threading.Lock()

    def install(self) -> None:
        """Wrap the current collectives (those this torch has)."""
        dist = _dist()
        if self.armed:
            return
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None:
                continue
            wrapper = self._wrappers[name] = TappedCollective(self, name, original)
            setattr(dist, name, wrapper)
        self.armed = True

    def remove(self) -> None:
        """Disarm; unwrap each collective whose wrapper is still the outermost."""
        self.armed = False
        dist = _dist()
        for name, wrapper in self._wrappers.items():
            if getattr(dist, name, None) is wrapper:
                setattr(dist, name, wrapper.original)
        self._wrappers.clear()

    def entering(self, name: str) -> None:
        """A call of ``name`` is about to go to the backend."""
        if not self.armed:
            return
        with self._lock:
            self.calls += 1
            if len(self.seen) < 100:
                self.seen.append(name)
        self.before(name)


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
    """The target rank's next collective at the step raises."""

    kind: Literal["collective_fail"] = "collective_fail"
    description: ClassVar[str] = (
        "A rank's next collective (all-reduce, broadcast, all-gather, reduce-scatter, "
        "barrier) raises DistBackendError at a step (a broken collective)."
    )


class CollectiveHangSpec(CollectiveFaultSpec):
    """The target rank stops entering collectives, alive."""

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
        self.tap = CollectiveTap(self._raise)
        self._rank = self._step = -1

    def _raise(self, collective: str) -> None:
        self.tap.armed = False  # once
        raise backend_error(
            f"tightrope collective_fail: {collective} failed on rank {self._rank} "
            f"(injected at step {self._step})"
        )

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        """Arm the failure on this rank."""
        if ctx.rank not in self.spec.target_ranks(ctx.world_size):
            return []
        self._rank, self._step = ctx.rank, ctx.step
        self.tap.install()
        details = {"rank": ctx.rank, "collectives": list(COLLECTIVES), "raises": "DistBackendError"}
        return [Injection(fault=self.spec.kind, target=f"rank {ctx.rank}", details=details)]

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Disarm (a step with no collective left it unused)."""
        self.tap.remove()
        return []


class CollectiveHangInjector(Injector[CollectiveHangSpec]):
    """Arms a tap whose first call blocks; the process stays alive and responsive to
    signals (it sleeps in short naps)."""

    def __init__(self, spec: CollectiveHangSpec) -> None:
        super().__init__(spec)
        self.tap = CollectiveTap(self._block)

    def _block(self, collective: str) -> None:
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
            "collectives": list(COLLECTIVES),
            "resume_after": self.spec.resume_after,
        }
        return [Injection(fault=self.spec.kind, target=f"rank {ctx.rank}", details=details)]

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Disarm, when the step ends at all."""
        self.tap.remove()
        return []
