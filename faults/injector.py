"""How a fault acts: an injector with hooks, called at fixed points by whoever can reach
where the fault acts (its spec's ``reach``).

``step`` (most kinds): the agent (in harness/) owns the loop position and calls, for every
armed fault whose spec says it is active at this step on this rank:

    on_batch(ctx, batch)   -> batch     before the forward pass (bad data)
    before_forward(ctx)                 install forward hooks (activation blow-up)
    gradient_params(ctx)   -> params    parameters whose gradient accumulation the agent
                                        hooks for the step; each calls on_gradient
    after_backward(ctx)                 gradients exist, before unscale/clip/step
    before_optimizer_step(ctx)          just before optimizer.step (learning rate)
    after_optimizer_step(ctx)           weights and optimizer state updated
    end_step(ctx)                       the step is over: undo temporary changes
    on_file_saved(ctx, path)            the trainer saved a file (faults that
                                        `waits_for_save`, from their trigger step on)

``documents``: the agent hands the trainer ``wrap_documents`` once, for the document
stream it sets up at start (every rank reads it alike, so ``ranks`` does not apply).

``node``: the harness, outside the trainer, calls ``on_node`` with the job's nodes
(a `NodeControl`) when the fault's step or time has come, and ``restore_node`` once
``restore_after`` seconds have passed.

Each hook that changes something returns `Injection` records; the agent (or the harness)
journals them as ``fault_injected`` events. Faults that act outside the loop (files,
processes) have an ``apply`` of their own and are driven the same way from ``end_step``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import torch
    from torch import nn
else:
    from faults.lazy_torch import nn, torch

from faults.errors import InjectionError
from faults.spec import FaultSpec

SpecT = TypeVar("SpecT", bound=FaultSpec)


class Inert:
    """What a hook of tightrope's on a trainer's model becomes in a copy of it
    (``copy.deepcopy``, pickling): a hook that does nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class InertCopies:
    """A hook that copies (``copy.deepcopy``) and pickles as `Inert`: a trainer's copy of
    its model (an EMA, a whole-module save) carries no fault and no agent."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Inert:
        return Inert()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Inert, ())


@dataclass(slots=True)
class StepContext:
    """What an injector may touch at one step on one rank."""

    step: int
    rank: int
    world_size: int
    model: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    run_dir: str | None = None
    #: The run's checkpoint folder (the harness knows the run directory's layout).
    checkpoints: str | None = None
    #: Process ids the job registered, by rank (for process faults).
    pids: dict[int, int] = field(default_factory=dict)
    #: The trainer's working directory (a ``path`` of a checkpoint fault is relative to it).
    cwd: str | None = None
    #: Journals records at once: a fault about to signal its own process hands its
    #: records here first, since the hook that signals may never return.
    record_now: Callable[[list[Injection]], None] | None = None


@dataclass(frozen=True, slots=True)
class Injection:
    """One thing a fault did: journaled as ``fault_injected``."""

    fault: str
    target: str
    details: dict[str, Any] = field(default_factory=dict)

    def event_fields(self, **details: Any) -> dict[str, Any]:
        """The fields of its ``fault_injected`` event; ``details`` join the record's own."""
        return {"fault": self.fault, "target": self.target, "details": self.details | details}


class NodeControl(Protocol):
    """The nodes of a job as the harness reaches them from outside (Docker containers)."""

    def fault(self, action: str, node: int, *, timeout: float) -> dict[str, Any]:
        """Kill, pause or stop ``node`` (``timeout``: seconds a stop waits before SIGKILL);
        a record of what was done, to journal."""
        ...

    def restore(self, action: str, node: int) -> None:
        """Undo ``action`` on ``node``: unpause it, or start it again so that it rejoins."""
        ...


class Injector(Generic[SpecT]):
    """Base injector: every hook does nothing; subclasses override the ones they need."""

    def __init__(self, spec: SpecT) -> None:
        self.spec = spec

    def on_batch(
        self, ctx: StepContext, batch: torch.Tensor
    ) -> tuple[torch.Tensor, list[Injection]]:
        """Replace or alter the batch about to be trained on."""
        return batch, []

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        """Called before the forward pass."""
        return []

    def gradient_params(self, ctx: StepContext) -> list[tuple[str, nn.Parameter]]:
        """Parameters whose gradient the fault hits during backward (see faults.gradient)."""
        return []

    def on_gradient(self, ctx: StepContext, name: str, grad: torch.Tensor) -> None:
        """One hooked parameter's gradient was just accumulated."""

    def after_backward(self, ctx: StepContext) -> list[Injection]:
        """Called when gradients exist, before unscaling, clipping and the optimizer step."""
        return []

    def before_optimizer_step(self, ctx: StepContext) -> list[Injection]:
        """Called just before ``optimizer.step``."""
        return []

    def after_optimizer_step(self, ctx: StepContext) -> list[Injection]:
        """Called just after ``optimizer.step``."""
        return []

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Called when the step is over; undo anything meant to last one step."""
        return []

    def waits_for_save(self) -> bool:
        """True when the fault, once triggered, waits for the trainer to save a file."""
        return False

    def on_file_saved(self, ctx: StepContext, path: str) -> list[Injection]:
        """The trainer saved ``path`` (a fault that `waits_for_save` may act on it)."""
        return []

    def wrap_documents(self, documents: Iterable[Any]) -> Iterator[Any]:
        """The training document stream with the fault in it (reach ``documents``)."""
        return iter(documents)

    def on_node(self, nodes: NodeControl) -> list[Injection]:
        """Act on a whole node of the job, from outside the trainer (reach ``node``)."""
        return []

    def restore_after(self) -> float | None:
        """Seconds after `on_node` at which the harness calls `restore_node`; None: never."""
        return None

    def restore_node(self, nodes: NodeControl) -> None:
        """Undo what `on_node` did: the node runs again, or rejoins the job."""


def require_model(ctx: StepContext, kind: str) -> nn.Module:
    """The model, or a clear error when the agent was attached without one."""
    if ctx.model is None:
        raise InjectionError(f"{kind} needs the model; attach the agent with one")
    return ctx.model


def matching_parameters(model: nn.Module, pattern: str) -> Iterator[tuple[str, nn.Parameter]]:
    """Parameters whose dotted name matches the glob ``pattern``."""
    for name, param in model.named_parameters():
        if fnmatch.fnmatchcase(name, pattern):
            yield name, param


def matching_modules(model: nn.Module, pattern: str) -> Iterator[tuple[str, nn.Module]]:
    """Sub-modules whose dotted name matches the glob ``pattern`` (never the root)."""
    for name, module in model.named_modules():
        if name and fnmatch.fnmatchcase(name, pattern):
            yield name, module
