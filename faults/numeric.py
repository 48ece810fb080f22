"""Numeric faults: poisoned and vanishing gradients, activation blow-up.

Bit flips live in `faults.bitflip`; how gradient faults reach gradients, in
`faults.gradient`; learning-rate spikes and bad batches, in `faults.loss_spike`. Every
random choice here draws from a private RNG keyed by (seed, kind, step, rank, what), never
from the global torch/numpy/python RNGs: the trainer's bit-exact resume depends on those
being untouched.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.hooks import RemovableHandle
else:
    from faults.lazy_torch import nn, torch

from faults.bias import Bias
from faults.errors import InjectionError
from faults.gradient import GradientFaultSpec, GradientInjector, no_match
from faults.injector import (
    InertCopies,
    Injection,
    Injector,
    StepContext,
    matching_modules,
    require_model,
)
from faults.spec import FaultClass, FaultSpec
from faults.tensors import as_1d_if_scalar, flat_coords, share, torch_generator

# -- nan_grad / inf_grad -------------------------------------------------------------------


class _PoisonGradSpec(GradientFaultSpec):
    """Fields shared by nan_grad and inf_grad."""

    fraction: Annotated[float, Bias((1.0, 1e-9))] = Field(
        default=1.0,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Share of the elements of each matching gradient hit (ceil, at least 1).",
    )


class NanGradSpec(_PoisonGradSpec):
    """Set gradient elements to NaN as backward accumulates them."""

    kind: Literal["nan_grad"] = "nan_grad"
    description: ClassVar[str] = "Set a share of the matching gradients' elements to NaN."
    fault_class: ClassVar[FaultClass] = "numeric"


class InfGradSpec(_PoisonGradSpec):
    """Set gradient elements to +inf as backward accumulates them."""

    kind: Literal["inf_grad"] = "inf_grad"
    description: ClassVar[str] = "Set a share of the matching gradients' elements to +inf."
    fault_class: ClassVar[FaultClass] = "numeric"


class _PoisonGradInjector(GradientInjector[_PoisonGradSpec]):
    """Writes ``value`` into a seeded share of each matching gradient (once a step: a NaN
    or an infinity survives any later accumulation)."""

    value: ClassVar[float]

    def hit(self, ctx: StepContext, name: str, grad: torch.Tensor) -> int:
        """Poison a seeded share of ``grad``."""
        spec = self.spec
        n = grad.numel()
        k = share(spec.fraction, n)
        if k == n:
            grad.fill_(self.value)
        else:
            gen = torch_generator(spec.seed, spec.kind, ctx.step, ctx.rank, name)
            chosen = torch.randperm(n, generator=gen)[:k]
            as_1d_if_scalar(grad)[flat_coords(grad, chosen)] = self.value
        return k

    def details(self, ctx: StepContext, names: list[str]) -> dict[str, Any]:
        """Parameters and elements hit, and the share asked for."""
        return super().details(ctx, names) | {"fraction": self.spec.fraction}


class NanGradInjector(_PoisonGradInjector):
    """NaN into gradients."""

    value = math.nan


class InfGradInjector(_PoisonGradInjector):
    """+inf into gradients."""

    value = math.inf


# -- grad_underflow ------------------------------------------------------------------------


class GradUnderflowSpec(GradientFaultSpec):
    """Push gradients towards zero until fp16 can no longer hold them."""

    kind: Literal["grad_underflow"] = "grad_underflow"
    description: ClassVar[str] = (
        "Shrink the matching gradients by a tiny factor; in fp16 mode what fp16 cannot hold "
        "at that size is flushed to zero (underflow)."
    )
    fault_class: ClassVar[FaultClass] = "numeric"

    factor: Annotated[float, Bias((1e-30, 1e-45, 1e-8), upto=1e-3)] = Field(
        default=1e-10, gt=0, lt=1, allow_inf_nan=False, description="Scale, 0 < factor < 1."
    )
    mode: Literal["fp16", "scale"] = Field(
        default="fp16",
        description=(
            "fp16: each element is rounded through fp16 at `factor` times its size and "
            "restored, so what fp16 cannot hold there becomes zero, as in an fp16 backward "
            "pass whose gradients sit that much lower; it acts before unscaling, so a larger "
            "loss scale lifts them back into range. scale: multiply by `factor` (a gradient "
            "that is really that small)."
        ),
    )


class GradUnderflowInjector(GradientInjector[GradUnderflowSpec]):
    """Shrinks the matching gradients at every accumulation, so the step's whole gradient
    is hit however many micro-batches it sums."""

    every_accumulation = True

    def __init__(self, spec: GradUnderflowSpec) -> None:
        super().__init__(spec)
        self._zeroed = 0

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        """A new step: nothing zeroed yet."""
        self._zeroed = 0
        return super().before_forward(ctx)

    def hit(self, ctx: StepContext, name: str, grad: torch.Tensor) -> int:
        """Shrink (or flush) ``grad``; count the elements that underflow turned to zero."""
        nonzero = int(torch.count_nonzero(grad))
        factor = self.spec.factor
        if self.spec.mode == "scale":
            grad.mul_(factor)
        else:  # what an fp16 tensor keeps of values `factor` times smaller, at their size
            grad.copy_((grad * factor).to(torch.float16).to(grad.dtype) / factor)
        self._zeroed += nonzero - int(torch.count_nonzero(grad))
        return grad.numel()

    def details(self, ctx: StepContext, names: list[str]) -> dict[str, Any]:
        """Parameters hit, the factor and mode, and what underflow actually zeroed."""
        spec = self.spec
        return {"params": names, "factor": spec.factor, "mode": spec.mode, "zeroed": self._zeroed}


# -- grad_spike ----------------------------------------------------------------------------


class GradSpikeSpec(GradientFaultSpec):
    """Scale gradients up: a burst that an adaptive optimizer's second moment must catch."""

    kind: Literal["grad_spike"] = "grad_spike"
    description: ClassVar[str] = (
        "Multiply the matching gradients by a large factor (a gradient burst, as in "
        "heavy-tailed gradient noise)."
    )
    fault_class: ClassVar[FaultClass] = "numeric"

    factor: Annotated[float, Bias((10.0, 1e3), upto=1e6)] = Field(
        default=10.0, gt=1, allow_inf_nan=False, description="Scale of the gradients, > 1."
    )


class GradSpikeInjector(GradientInjector[GradSpikeSpec]):
    """Scales the matching gradients at every accumulation, so the step's whole gradient
    is that much larger however many micro-batches it sums.

    Adam divides by the root of a running mean of squared gradients; with ``beta2`` near 1
    that mean takes ~1/(1 - beta2) steps to catch up with a burst, and until then the
    update is up to ``factor`` times its usual size."""

    every_accumulation = True

    def hit(self, ctx: StepContext, name: str, grad: torch.Tensor) -> int:
        """Multiply ``grad`` by the factor."""
        grad.mul_(self.spec.factor)
        return grad.numel()

    def details(self, ctx: StepContext, names: list[str]) -> dict[str, Any]:
        """Parameters hit and the factor."""
        return {"params": names, "factor": self.spec.factor}


# -- activation_overflow -------------------------------------------------------------------


class ActivationOverflowSpec(FaultSpec):
    """Scale a module's output during the forward pass."""

    kind: Literal["activation_overflow"] = "activation_overflow"
    description: ClassVar[str] = "Multiply the matching modules' outputs by a large factor."
    fault_class: ClassVar[FaultClass] = "numeric"

    target: str = Field(min_length=1, description="Glob on module names, e.g. 'blocks.1.mlp'.")
    factor: Annotated[float, Bias((1e5, 7e4, 1e39), upto=1e40)] = Field(
        default=1e5, gt=1, allow_inf_nan=False, description="Scale of the output, > 1."
    )


class OutputScaler(InertCopies):
    """The forward hook of `ActivationOverflowInjector`: multiplies a module's output (a
    copy of the model made during the faulted step gets a hook that does nothing)."""

    def __init__(self, name: str, factor: float) -> None:
        self.name, self.factor = name, factor

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        factor = self.factor
        if isinstance(output, torch.Tensor):
            return output * factor
        if isinstance(output, (tuple, list)) and output and torch.is_tensor(output[0]):
            items = [output[0] * factor, *output[1:]]
            # A named tuple takes its fields as positional arguments.
            return type(output)(*items) if hasattr(output, "_fields") else type(output)(items)
        # Raised in the forward pass rather than passed through: a fault that silently
        # does nothing would make the experiment look like a clean survival.
        raise InjectionError(
            f"activation_overflow: output of module {self.name!r} is "
            f"{type(output).__name__}, not a tensor or a tuple starting with one"
        )


class ActivationOverflowInjector(Injector[ActivationOverflowSpec]):
    """Forward hooks installed before the forward pass and removed when the step ends."""

    def __init__(self, spec: ActivationOverflowSpec) -> None:
        super().__init__(spec)
        self._handles: list[RemovableHandle] = []

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        """Hook every matching module (never twice: earlier hooks are removed first)."""
        spec = self.spec
        model = require_model(ctx, spec.kind)
        modules = sorted(matching_modules(model, spec.target), key=lambda item: item[0])
        if not modules:
            names = [name for name, _ in model.named_modules() if name]
            raise no_match(spec.kind, "module", spec.target, names)
        self._remove()
        for name, module in modules:
            self._handles.append(module.register_forward_hook(OutputScaler(name, self.spec.factor)))
        details = {"modules": [name for name, _ in modules], "factor": spec.factor}
        return [Injection(fault=spec.kind, target=spec.target, details=details)]

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Remove the hooks: the fault lasts one step unless re-armed."""
        self._remove()
        return []

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
