"""Fail-slow faults: a rank that computes slowly, or whose collectives start late.

``straggler``: busy work on the rank's own core inside the step, after the backward pass,
lasting ``factor - 1`` times that step's forward and backward passes (so the rank's
compute takes ``factor`` times as long); the other ranks really wait for it in the next
collective. ``duration`` steps, or for good with ``duration`` as long as the run.
``slow_link``: ``latency_ms`` added before each of the rank's collectives during the
step (`faults.collective.CollectiveTap`: the calls made through ``torch.distributed``,
all-reduce, broadcast, all-gather, reduce-scatter and barrier, and DDP's buckets where
its communication hook goes through ``torch.distributed.all_reduce``).
"""

from __future__ import annotations

import time
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from faults.bias import Bias
from faults.collective import CollectiveTap
from faults.injector import Injection, Injector, StepContext
from faults.spec import FaultClass, FaultSpec


def spin(seconds: float) -> int:
    """Busy work on this process's core for ``seconds`` (holding it, as slow compute
    does; never a sleep, which frees the core). The number of rounds done."""
    end = time.perf_counter() + seconds
    rounds, x = 0, 1.0
    while time.perf_counter() < end:
        for _ in range(200):
            x = x * 1.0000001 + 1e-9
        rounds += 1
    return rounds


class SlowFaultSpec(FaultSpec):
    """Fields the fail-slow kinds share."""

    fault_class: ClassVar[FaultClass] = "process"


class StragglerSpec(SlowFaultSpec):
    """The target ranks compute ``factor`` times as long."""

    kind: Literal["straggler"] = "straggler"
    description: ClassVar[str] = (
        "A rank computes `factor` times as long (busy work on its core in the step), "
        "for `duration` steps."
    )
    factor: Annotated[float, Bias((1.2, 1.5, 2.0, 5.0), upto=10)] = Field(
        default=2.0, gt=1, le=100, description="The rank's compute time is multiplied by this."
    )


class SlowLinkSpec(SlowFaultSpec):
    """The target ranks' collectives start ``latency_ms`` late."""

    kind: Literal["slow_link"] = "slow_link"
    description: ClassVar[str] = (
        "Added latency before each of a rank's collectives, for `duration` steps."
    )
    latency_ms: Annotated[float, Bias((5.0, 50.0, 500.0), upto=2000)] = Field(
        default=50.0, gt=0, le=60_000, description="Milliseconds added before each collective."
    )


class StragglerInjector(Injector[StragglerSpec]):
    """Times the forward and backward passes, then spins for the extra time."""

    def __init__(self, spec: StragglerSpec) -> None:
        super().__init__(spec)
        self._started: float | None = None

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        """Start the clock of the step's passes."""
        self._started = time.perf_counter()
        return []

    def after_backward(self, ctx: StepContext) -> list[Injection]:
        """Spin ``factor - 1`` times the passes' time on this rank."""
        if self._started is None or ctx.rank not in self.spec.target_ranks(ctx.world_size):
            return []
        passes = time.perf_counter() - self._started
        self._started = None
        extra = (self.spec.factor - 1.0) * passes
        spin(extra)
        details = {
            "rank": ctx.rank,
            "factor": self.spec.factor,
            "passes_seconds": round(passes, 6),
            "busy_seconds": round(extra, 6),
        }
        return [Injection(fault=self.spec.kind, target=f"rank {ctx.rank}", details=details)]


class SlowLinkInjector(Injector[SlowLinkSpec]):
    """Sleeps ``latency_ms`` before each collective of the rank during the step."""

    def __init__(self, spec: SlowLinkSpec) -> None:
        super().__init__(spec)
        self.tap = CollectiveTap(self._delay)

    def _delay(self, collective: str) -> None:
        time.sleep(self.spec.latency_ms / 1000.0)

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        """Delay this rank's collectives for the step."""
        if ctx.rank not in self.spec.target_ranks(ctx.world_size):
            return []
        self.tap.install()
        details = {"rank": ctx.rank, "latency_ms": self.spec.latency_ms}
        return [Injection(fault=self.spec.kind, target=f"rank {ctx.rank}", details=details)]

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Back to the plain collectives."""
        self.tap.remove()
        return []
