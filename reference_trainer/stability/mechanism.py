"""What a stability mechanism is to the trainer: a `Mechanism` with hooks at fixed points of
a step, each doing nothing unless the mechanism overrides it, in the style of the fault
injectors (`faults/injector.py`). The step calls every mechanism the registry
(`reference_trainer.stability.registry`) built, in the registry's order, at each point:

    lr_factor(step)        -> float    a multiplier on the scheduled learning rate
    begin_step(s)                      the step's learning rate is set, no batch yet
    on_micro_batch(...)                one micro-batch's logits, before its backward
    weigh_loss(...)        -> loss     the loss that micro-batch's backward takes
    after_backward(s)                  gradients unscaled, this rank's norm in ``s``
    local_slice(s)         -> values   its part of the one all-reduce the ranks agree by
    agreed(s, values)                  the same part, summed over ranks
    judge(s)                           whether the update is skipped (``s.skip``)
    repair(s)                          repair instead of skip; the step's verdict claims
    adjust_gradients(s)                an update follows: change the gradients (clipping)
    before_update(s) / after_update(s) around ``optimizer.step`` (or its skip)
    end_step(s)                        the update is done: claims of what changed
    finish(s)                          the `step` observation is made: last claims
    precision_changed(name)            the trainer switched precision (level-3 recovery)
    between_steps(b)       -> failure  the step is journaled: a check of the run's state,
                                       which may be a failure for the recovery policy

and ``state_dict``/``load_state_dict`` over its keys of the checkpoint's ``trainer`` state.
A hook reads and writes the step through one `StepState`; claims go to ``s.claims`` in the
order the mechanisms run, which is the order the journal shows them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from harness.records.events import Claim, DataWeightsObserved
from reference_trainer.stability.layer_stats import StepStats
from reference_trainer.stability.loss_scale import DynamicLossScaler
from reference_trainer.stability.recovery import Failure

if TYPE_CHECKING:
    from reference_trainer.model.gpt import GPT
    from reference_trainer.processes.distributed import Topology
    from reference_trainer.stability.mechanisms import StabilityConfig
    from reference_trainer.stream.data import DocumentPipeline, ShardedLoader


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What a mechanism is built from: the run's settings and the pieces it acts on."""

    stability: StabilityConfig
    #: "fp32", "bf16" or "fp16".
    precision: str
    #: The schedule's warmup steps, the run's last step.
    warmup_steps: int
    steps: int
    #: Sequences per optimizer step over every rank, and the optimizer's name.
    global_batch: int
    optimizer: str
    source_weights: dict[str, float]
    #: The run's seed.
    seed: int
    model: GPT
    topo: Topology
    scaler: DynamicLossScaler
    documents: DocumentPipeline
    loader: ShardedLoader | Any


@dataclass(slots=True)
class StepState:
    """One step as the mechanisms see it and shape it."""

    step: int
    lr: float
    claims: list[Claim] = field(default_factory=list)
    #: Fields of the step's `StepObserved` that mechanisms give (by field name).
    observed: dict[str, Any] = field(default_factory=dict)
    #: This rank's global gradient norm, after unscaling.
    grad_norm: float = math.nan
    #: Agreed by every rank: the mean loss, whether all losses and gradients are finite,
    #: the mean gradient norm (meaningful when all are finite).
    loss: float = math.nan
    all_finite: bool = True
    mean_norm: float = math.nan
    #: The update is skipped on every rank.
    skip: bool = False
    #: Some rank saw a layer stop updating (fp16 raises the loss scale).
    stalled: bool = False
    #: A multiplier on the clipping threshold for this step.
    clip_factor: float = 1.0
    #: Per-layer statistics of the step and the corpus's sampling weights, when journaled.
    layers: StepStats | None = None
    data: DataWeightsObserved | None = None


@dataclass(slots=True)
class Boundary:
    """Between two steps, as a mechanism that checks the run's state sees it."""

    #: The step just done.
    step: int
    #: A checkpoint is saved after this step.
    save_due: bool
    #: Claims to journal at once, before the loop looks at any other failure.
    claims: list[Claim] = field(default_factory=list)


class Mechanism:
    """Base mechanism: every hook does nothing; subclasses override the ones they need."""

    #: Its name in `harness.mechanisms` (``--disable``/``--enable``).
    name: ClassVar[str]
    #: Its keys in the checkpoint's ``trainer`` state (``{}`` each while it is off).
    state_keys: ClassVar[tuple[str, ...]] = ()
    #: Zeros it adds to the agreement while it is off (the collective keeps its shape).
    idle_slice: ClassVar[int] = 0

    @classmethod
    def build(cls, ctx: BuildContext) -> Mechanism | None:
        """The mechanism for this run, or None when it is off."""
        raise NotImplementedError

    def lr_factor(self, step: int) -> float:
        """Multiplier on the learning rate of 1-based ``step``."""
        return 1.0

    def begin_step(self, s: StepState) -> None:
        """A new step: its learning rate is set, no batch seen yet."""

    def on_micro_batch(self, micro: int, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """One micro-batch's logits and targets, before its backward."""

    def weigh_loss(
        self, micro: int, logits: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor
    ) -> torch.Tensor:
        """The loss the micro-batch's backward takes (``loss``, its mean, unless changed)."""
        return loss

    def after_backward(self, s: StepState) -> None:
        """Gradients exist and are unscaled; ``s.grad_norm`` is this rank's."""

    def local_slice(self, s: StepState) -> list[float] | torch.Tensor | None:
        """This rank's values to sum over ranks (None: none)."""
        return None

    def agreed(self, s: StepState, values: torch.Tensor) -> None:
        """The values of `local_slice`, summed over ranks."""

    def judge(self, s: StepState) -> None:
        """Decide, with the agreed figures, whether the update is skipped."""

    def repair(self, s: StepState) -> None:
        """Repair what a skip would lose; the claims of what the step's checks found."""

    def adjust_gradients(self, s: StepState) -> None:
        """An update follows: change the gradients before the optimizer sees them."""

    def before_update(self, s: StepState) -> None:
        """Just before ``optimizer.step``."""

    def after_update(self, s: StepState) -> None:
        """Just after ``optimizer.step``, or after the update was skipped (``s.skip``)."""

    def end_step(self, s: StepState) -> None:
        """The update is over: claims of what the mechanism changed."""

    def finish(self, s: StepState) -> None:
        """The step's observation is made: the step's last claims."""

    def precision_changed(self, name: str) -> None:
        """The trainer now trains in ``name`` precision."""

    def between_steps(self, b: Boundary) -> Failure | None:
        """After the step: a failure for the recovery policy, or None. Every rank calls it
        (it may be a collective)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Its part of the checkpoint's ``trainer`` state, under `state_keys`."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from the checkpoint's whole ``trainer`` state (its keys may be absent)."""
