"""What every fault specification shares: when it fires, where, and its seed.

A fault is a pydantic model: typed, validated, and described by JSON Schema for
editors. The common fields say *when* (``at_step``, ``every``, ``probability``,
``after_seconds``, each active for ``duration`` steps once fired) and *where*
(``ranks``: a list, ``"all"``, or ``"random"`` with ``spare_ranks`` never chosen).
Steps are counted as the journal counts them: the first training step is step 1.

Every decision is a pure function of the spec and its ``seed`` (never of a global RNG),
so every rank of a job, and every rerun, takes the same decision.

Each kind also declares, as class attributes, what the harness needs to know of it
without running it: its `FaultClass` (what it is scored under), its `Reach` (where it
acts, so which injector hooks drive it) and the triggers it honours.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

#: The classes faults are scored under (scenario scores and scorecards group by them).
FaultClass = Literal["numeric", "loss_spike", "checkpoint", "process", "data"]
FAULT_CLASSES: tuple[FaultClass, ...] = get_args(FaultClass)

#: Where a fault acts, and so which hooks of its injector (`faults.injector`) drive it:
#: ``step``, the agent's hooks inside each training step; ``documents``, the document
#: stream the trainer sets up at start (`Injector.wrap_documents`); ``node``, a whole node,
#: which the harness reaches from outside the trainer (`Injector.on_node`).
Reach = Literal["step", "documents", "node"]

#: The fields that say when a fault fires.
Trigger = Literal["at_step", "every", "probability", "after_seconds"]
TRIGGERS: tuple[Trigger, ...] = get_args(Trigger)

#: The latest step a fault may name (``at_step``, ``every``, ``duration``): a suite's
#: trainer runs at most this many steps, and a step past it is a typo or an attack.
MAX_STEP = 10**8
#: Ranks are numbered below this: past the largest job anyone runs (a rank of 10**12 is
#: no rank of any job).
MAX_RANKS = 1 << 20


def seeded(seed: int, *parts: object) -> random.Random:
    """A private RNG for one decision: the same (seed, parts) always draws the same."""
    return random.Random(":".join(str(p) for p in (seed, *parts)))


class FaultSpec(BaseModel):
    """Common fields of every fault kind; subclasses add ``kind`` and their own fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: One-line description, shown by ``tightrope faults``.
    description: ClassVar[str] = ""
    #: The class the kind is scored under (every kind declares one).
    fault_class: ClassVar[FaultClass]
    #: Where the kind acts.
    reach: ClassVar[Reach] = "step"
    #: The triggers the kind honours; validation refuses the others, naming the field.
    triggers: ClassVar[tuple[Trigger, ...]] = TRIGGERS

    kind: str
    at_step: int | None = Field(
        default=None,
        ge=1,
        le=MAX_STEP,
        description="Fire at this step (with `every`: the first firing).",
    )
    every: int | None = Field(
        default=None, ge=1, le=MAX_STEP, description="Fire again every N steps."
    )
    probability: float | None = Field(
        default=None, gt=0, le=1, description="Fire at each step with this probability."
    )
    after_seconds: float | None = Field(
        default=None, ge=0, description="Fire at the first step after this many seconds."
    )
    duration: int = Field(
        default=1, ge=1, le=MAX_STEP, description="Steps the fault stays active once fired."
    )
    ranks: list[int] | Literal["all", "random"] = Field(
        default="all", description="Ranks hit: a list, all, or one chosen at random (seeded)."
    )
    spare_ranks: list[int] = Field(
        default_factory=list, description="Ranks `random` never picks (for example rank 0)."
    )
    seed: int = Field(default=0, description="Seed of every random choice this fault makes.")

    @field_validator(*TRIGGERS)
    @classmethod
    def _honoured(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.field_name not in cls.triggers:
            kind = cls.model_fields["kind"].default
            raise ValueError(
                f"{kind} honours {' or '.join(cls.triggers)} only, not {info.field_name}"
            )
        return value

    @model_validator(mode="after")
    def _one_trigger(self) -> FaultSpec:
        triggers = [n for n in ("probability", "after_seconds") if getattr(self, n) is not None]
        if self.at_step is not None or self.every is not None:
            triggers.insert(0, "at_step/every")
        if len(triggers) != 1:
            raise ValueError(
                "give exactly one trigger: at_step (optionally with every), every, "
                f"probability or after_seconds; got {', '.join(triggers) or 'none'}"
            )
        for name in ("ranks", "spare_ranks"):
            ranks = getattr(self, name)
            if isinstance(ranks, list) and any(not 0 <= r < MAX_RANKS for r in ranks):
                raise ValueError(f"{name} must be from 0 to {MAX_RANKS - 1}, got {ranks}")
        return self

    # -- when ---------------------------------------------------------------------------

    def fires_at(self, step: int) -> bool:
        """True when a step-triggered fault *starts* at ``step`` (not for after_seconds)."""
        if self.probability is not None:
            return seeded(self.seed, "probability", step).random() < self.probability
        if self.at_step is None and self.every is None:
            return False
        first = self.at_step if self.at_step is not None else self.every
        assert first is not None
        if step < first:
            return False
        return step == first if self.every is None else (step - first) % self.every == 0

    def active_at(self, step: int) -> bool:
        """True when a step-triggered fault is active at ``step`` (fired within ``duration``)."""
        return any(self.fires_at(s) for s in range(max(1, step - self.duration + 1), step + 1))

    # -- where --------------------------------------------------------------------------

    def target_ranks(self, world_size: int) -> frozenset[int]:
        """The ranks this fault hits in a job of ``world_size`` ranks."""
        if self.ranks == "all":
            return frozenset(range(world_size))
        if self.ranks == "random":
            pool = [r for r in range(world_size) if r not in self.spare_ranks]
            if not pool:
                return frozenset()
            return frozenset({seeded(self.seed, "rank").choice(pool)})
        return frozenset(r for r in self.ranks if r < world_size)

    def target_node(self) -> int | None:
        """The node a kind whose `reach` is ``node`` hits; None for every other kind."""
        return None

    def summary(self) -> dict[str, Any]:
        """The spec as a plain dict without defaults, for journals and listings."""
        return self.model_dump(exclude_defaults=True) | {"kind": self.kind}
