"""A sweep's fault mix drawn per seed, as a soak draws its faults.

```yaml
fault_mix: {rate: 0.02}                  # faults per step; kinds: the soak's (all by default)
fault_mix: {rate: 0.02, kinds: [nan_grad, kill, truncate]}
```

Each seed draws its own faults with `harness.soak.plan.draw_plan` (Poisson arrivals of
``rate`` a step over the run's steps, each fault's kind picked from ``kinds`` and the rest
drawn by the suite strategies), from the seed, the run's steps, ranks and checkpoint
interval: every cell of the grid (every arm) meets the same faults at a seed. The drawn
faults come after the scenario's own, and the run may restart as often as a soak's
(`harness.soak.plan.restarts_needed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from faults.plan import FaultPlan
from faults.spec import FaultSpec
from harness.soak.plan import SoakPlanError, check_kinds, draw_plan, restarts_needed
from harness.suites.scenario import TrainerSpec
from harness.suites.suite_loader import Problems

_KEYS = ("rate", "kinds")


@dataclass(frozen=True, slots=True)
class FaultMix:
    """How a seed's faults are drawn: ``rate`` a step, from ``kinds`` (None: the soak's)."""

    rate: float
    kinds: tuple[str, ...] | None = None

    def draw(self, trainer: TrainerSpec, seed: int) -> list[FaultSpec]:
        """The faults of ``seed`` for a run of ``trainer``: the same for the same seed,
        steps, ranks and checkpoint interval."""
        plan = draw_plan(
            seed=seed,
            steps=trainer.steps,
            rate=self.rate,
            kinds=self.kinds,
            world_size=trainer.world_size,
            checkpoint_every=trainer.checkpoint_every,
        )
        return list(plan)

    @staticmethod
    def restarts(faults: list[FaultSpec]) -> int:
        """Restarts a soak would allow for these faults."""
        return restarts_needed(FaultPlan(tuple(faults)))


def parse_fault_mix(raw: Any, out: Problems) -> FaultMix | None:
    """The sweep file's ``fault_mix`` (None when it has none); problems go to ``out``."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        out.add(("fault_mix",), "expected a mapping with rate (faults per step) and kinds")
        return None
    for key in sorted(set(map(str, raw)) - set(_KEYS)):
        out.add(("fault_mix", key), f"unknown key; a fault mix has {', '.join(_KEYS)}")
    rate = raw.get("rate")
    good_rate = (
        isinstance(rate, int | float) and not isinstance(rate, bool)
        and math.isfinite(rate) and 0 < rate <= 1
    )  # fmt: skip
    if not good_rate:
        out.add(("fault_mix", "rate"), f"expected faults per step in (0, 1], got {rate!r}")
    kinds = raw.get("kinds")
    if kinds is not None and not (
        isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)
    ):
        out.add(("fault_mix", "kinds"), f"expected a list of fault kinds, got {kinds!r}")
        return None
    try:
        chosen = None if kinds is None else check_kinds(kinds)
    except SoakPlanError as exc:
        out.add(("fault_mix", "kinds"), str(exc))
        return None
    if not good_rate or not isinstance(rate, int | float):
        return None
    return FaultMix(float(rate), chosen)
