"""Gradient faults act where real ones arise: on each parameter as backward accumulates its
gradient, before DDP's all-reduce, the trainer's non-finite guard, ``GradScaler`` or
clipping can see it.

The agent asks an active gradient injector for `gradient_params` when its step begins and
registers a post-accumulate-grad hook on each, which calls `on_gradient` during backward
(on every rank the fault targets; under DDP a NaN on one rank then reaches every rank
through the all-reduce, as a real one does). ``after_backward`` reports what was hit and
hits any matching gradient that backward did not reach (a gradient set by hand), so an
injector also works when called directly after a backward pass.

``at: before_step`` keeps the older point, after the trainer's clipping and checks, just
before ``optimizer.step``: an explicit choice, never the default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import Field

if TYPE_CHECKING:
    import torch
    from torch import nn
else:
    from faults.lazy_torch import nn, torch

from faults.errors import InjectionError
from faults.injector import Injection, Injector, StepContext, matching_parameters, require_model
from faults.spec import FaultSpec

#: Where a gradient fault acts: during backward (default) or just before the update.
GradientPoint = Literal["backward", "before_step"]


class GradientFaultSpec(FaultSpec):
    """Fields every gradient fault shares."""

    target: str = Field(
        default="*", min_length=1, description="Glob on parameter names, e.g. 'blocks.0.*'."
    )
    at: GradientPoint = Field(
        default="backward",
        description="backward: as each gradient is accumulated, before any all-reduce, "
        "guard or clipping; before_step: just before optimizer.step (after clipping).",
    )


GradSpecT = TypeVar("GradSpecT", bound=GradientFaultSpec)


class GradientInjector(Injector[GradSpecT]):
    """Base of gradient faults: subclasses say how one gradient is hit (`hit`)."""

    #: Hit again at every accumulation of the step (a scale), or once (a poison, a flip).
    every_accumulation: ClassVar[bool] = False

    def __init__(self, spec: GradSpecT) -> None:
        super().__init__(spec)
        self._hits: dict[str, int] = {}  # parameter name -> elements hit this step
        self._reported: set[str] = set()

    # -- what the agent hooks --------------------------------------------------------

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        """A new step: nothing hit yet."""
        self._hits, self._reported = {}, set()
        return []

    def gradient_params(self, ctx: StepContext) -> list[tuple[str, nn.Parameter]]:
        """The parameters whose gradient accumulation the agent hooks for this step."""
        if self.spec.at != "backward":
            return []
        model = require_model(ctx, self.spec.kind)
        matched = self.chosen(ctx, self.trainable(model))
        if not matched:
            names = [name for name, _ in model.named_parameters()]
            raise no_match(self.spec.kind, "trainable parameter", self.spec.target, names)
        return matched

    def on_gradient(self, ctx: StepContext, name: str, grad: torch.Tensor) -> None:
        """One parameter's gradient was just accumulated: hit it."""
        if name in self._hits and not self.every_accumulation:
            return
        with torch.no_grad():
            self._hits[name] = self._hits.get(name, 0) + self.hit(ctx, name, grad)

    # -- the step's fixed points ------------------------------------------------------

    def after_backward(self, ctx: StepContext) -> list[Injection]:
        """Report what backward hit; hit matching gradients it did not reach."""
        return self._settle(ctx) if self.spec.at == "backward" else []

    def before_optimizer_step(self, ctx: StepContext) -> list[Injection]:
        """With ``at: before_step``: hit the matching gradients now."""
        return self._settle(ctx) if self.spec.at == "before_step" else []

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Report hits not reported yet (a backward the agent did not see end)."""
        return self._report(ctx)

    # -- for subclasses ----------------------------------------------------------------

    def trainable(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """Matching parameters that can get a gradient, by name."""
        matched = matching_parameters(model, self.spec.target)
        return sorted(((n, p) for n, p in matched if p.requires_grad), key=lambda i: i[0])

    def chosen(
        self, ctx: StepContext, candidates: list[tuple[str, nn.Parameter]]
    ) -> list[tuple[str, nn.Parameter]]:
        """Which of the candidates this step hits (all of them, unless overridden)."""
        return candidates

    def hit(self, ctx: StepContext, name: str, grad: torch.Tensor) -> int:
        """Damage one gradient in place; the number of elements hit."""
        raise NotImplementedError

    def details(self, ctx: StepContext, names: list[str]) -> dict[str, Any]:
        """Details of the record for the gradients ``names`` hit."""
        return {"params": names, "elements": sum(self._hits[n] for n in names)}

    # -- internals ---------------------------------------------------------------------

    def _settle(self, ctx: StepContext) -> list[Injection]:
        model = require_model(ctx, self.spec.kind)
        matched = self.trainable(model)
        with_grad = [(n, p) for n, p in matched if p.grad is not None]
        if not with_grad and not self._hits:
            names = [name for name, _ in model.named_parameters()]
            what = "parameter with a gradient" if matched else "parameter"
            raise no_match(self.spec.kind, what, self.spec.target, names)
        for name, param in self.chosen(ctx, with_grad):
            if name not in self._hits and param.grad is not None:
                self.on_gradient(ctx, name, param.grad)
        return self._report(ctx)

    def _report(self, ctx: StepContext) -> list[Injection]:
        fresh = sorted(n for n in self._hits if n not in self._reported)
        if not fresh:
            return []
        self._reported.update(fresh)
        details = self.details(ctx, fresh) | {"at": self.spec.at}
        return [Injection(fault=self.spec.kind, target=self.spec.target, details=details)]


def no_match(kind: str, what: str, pattern: str, names: list[str]) -> InjectionError:
    """The error for a target pattern that selects nothing, listing a few candidates."""
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    return InjectionError(
        f"{kind}: no {what} matches target {pattern!r}; available: {shown or 'none'}"
    )
