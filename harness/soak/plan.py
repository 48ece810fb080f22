"""A soak's faults: Poisson arrivals over the steps, each fault drawn from one seed.

The arrival steps come from a seeded exponential clock (``rate`` faults per step on
average); each fault's kind is picked uniformly from the soak's kinds and everything
else about it (target, ranks, bit, file, pause, ...) is drawn by
`harness.suites.strategies.fault_specs`, biased toward the choices that break guards.
The same seed, steps and kinds give the same plan, so a soak replays from its seed.
Drawn triggers are replaced by the arrival step: a soak fault fires once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from faults.plan import FaultPlan
from faults.registry import kinds as registered_kinds
from faults.registry import parse_fault
from faults.spec import FaultSpec
from harness.errors import TightropeError

#: Longest a drawn fault stays active: a NaN gradient for hundreds of steps is a broken
#: run, not a fault to recover from.
MAX_DURATION = 3


class SoakPlanError(TightropeError):
    """A soak cannot be planned as asked (unknown kinds, a rate out of range, ...)."""


def soak_kinds() -> tuple[str, ...]:
    """The kinds a soak draws by default: every kind the strategies draw that hits a step
    of the running job (not the document stream, fixed at start, nor Docker nodes)."""
    from harness.suites.strategies import DRAWN_KINDS

    table = registered_kinds()
    return tuple(sorted(k for k in DRAWN_KINDS if table[k].spec.reach == "step"))


def check_kinds(names: Sequence[str] | None) -> tuple[str, ...]:
    """The kinds to draw: ``names`` checked against `soak_kinds` (default: all of them)."""
    allowed = soak_kinds()
    if names is None:
        return allowed
    chosen = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not chosen:
        raise SoakPlanError("no fault kinds given; expected some of " + ", ".join(allowed))
    unknown = [n for n in chosen if n not in allowed]
    if unknown:
        raise SoakPlanError(
            f"fault kind(s) {', '.join(map(repr, unknown))} cannot be drawn by a soak; "
            f"expected some of {', '.join(allowed)}"
        )
    return chosen


def arrival_steps(seed: int, steps: int, rate: float) -> list[int]:
    """Steps in [1, steps] at which faults arrive: a Poisson process of ``rate`` per step
    (two arrivals in one step move the second to the next free step)."""
    if not (isinstance(rate, float | int) and 0 < rate <= 1 and math.isfinite(rate)):
        raise SoakPlanError(f"fault rate {rate!r}: expected a number of faults per step in (0, 1]")
    clock = random.Random(f"{seed}:arrivals")
    found: list[int] = []
    at = 0.0
    while True:
        at += clock.expovariate(rate)
        step = max(math.ceil(at), found[-1] + 1 if found else 1)
        if step > steps:
            return found
        found.append(step)


def draw_plan(
    *,
    seed: int,
    steps: int,
    rate: float,
    kinds: Sequence[str] | None = None,
    world_size: int = 2,
    checkpoint_every: int | None = None,
) -> FaultPlan:
    """The soak's faults, in step order: the same arguments always give the same plan."""
    from harness.suites.strategies import drawn_from_seed, fault_specs

    names = check_kinds(kinds)
    picker = random.Random(f"{seed}:kinds")
    table = {
        name: fault_specs(
            kinds=[name], max_step=steps, world_size=world_size, checkpoint_every=checkpoint_every
        )
        for name in names
    }
    faults = []
    for i, step in enumerate(arrival_steps(seed, steps, rate)):
        drawn = drawn_from_seed(table[picker.choice(names)], (seed * 1_000_003 + i) % 2**32)
        faults.append(at_step(drawn, step, f"soak fault {i}"))
    return FaultPlan(tuple(faults))


def restarts_needed(plan: FaultPlan) -> int:
    """Restarts torchrun may need to see ``plan`` through: two per process fault (the first
    elastic restart after a lost worker can fail to connect) plus two, at most 100."""
    return min(100, 2 * sum(type(f).fault_class == "process" for f in plan) + 2)


def at_step(spec: FaultSpec, step: int, where: str) -> FaultSpec:
    """``spec`` fired once, at ``step``, for at most `MAX_DURATION` steps."""
    data = spec.model_dump(mode="json", exclude_defaults=True)
    for trigger in ("every", "probability", "after_seconds"):
        data.pop(trigger, None)
    data |= {"kind": spec.kind, "at_step": step, "duration": min(spec.duration, MAX_DURATION)}
    return parse_fault(data, where)
