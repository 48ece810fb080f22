"""The bitflip fault: flip one bit of a few elements of a weight, gradient or optimizer state.

A flip goes through an integer view of the tensor's own storage, so it is exact: the
raw bits before and after differ in one position on exactly ``count`` elements. Integer
tensors of 8 bits are codes (an 8-bit optimizer keeps its moments so, as indices into a code
book): their stored byte is flipped at a position the spec names, since a code has no sign,
exponent or mantissa to choose from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

if TYPE_CHECKING:
    import torch
    from torch import nn
else:
    from faults.lazy_torch import nn, torch

from faults.bias import Bias
from faults.errors import InjectionError
from faults.gradient import GradientFaultSpec, GradientInjector, no_match
from faults.injector import Injection, StepContext, matching_parameters, require_model
from faults.spec import FaultClass, seeded
from faults.tensors import as_1d_if_scalar, flat_coords, require_optimizer

BitClass = Literal["sign", "exponent", "mantissa"]


@dataclass(frozen=True, slots=True)
class Layout:
    """Where sign, exponent and mantissa sit in one floating-point format."""

    width: int
    mantissa: int  # mantissa bits: 0 .. mantissa-1; exponent: mantissa .. width-2
    as_int: torch.dtype

    def positions(self, bit_class: BitClass) -> range:
        """The bit positions of ``bit_class``."""
        if bit_class == "sign":
            return range(self.width - 1, self.width)
        if bit_class == "exponent":
            return range(self.mantissa, self.width - 1)
        return range(self.mantissa)

    def classify(self, bit: int) -> BitClass:
        """The class of bit position ``bit``."""
        if bit == self.width - 1:
            return "sign"
        return "exponent" if bit >= self.mantissa else "mantissa"

    def describe(self) -> str:
        """E.g. 'sign 15, exponent 10-14, mantissa 0-9'."""
        return f"sign {self.width - 1}, exponent {self.mantissa}-{self.width - 2}, " + (
            f"mantissa 0-{self.mantissa - 1}"
        )


def layouts() -> dict[torch.dtype, Layout]:
    """Each floating-point dtype's layout (built on first use: torch loads lazily)."""
    if not _LAYOUTS:
        _LAYOUTS.update(
            {
                torch.float64: Layout(64, 52, torch.int64),
                torch.float32: Layout(32, 23, torch.int32),
                torch.float16: Layout(16, 10, torch.int16),
                torch.bfloat16: Layout(16, 7, torch.int16),
            }
        )
    return _LAYOUTS


_LAYOUTS: dict[torch.dtype, Layout] = {}


def code_views() -> dict[torch.dtype, torch.dtype]:
    """8-bit code dtypes and the signed view their byte is flipped through."""
    return {torch.uint8: torch.int8, torch.int8: torch.int8}


def __getattr__(name: str) -> Any:
    """``LAYOUTS``: the table of `layouts`, built on first use."""
    if name == "LAYOUTS":
        return layouts()
    raise AttributeError(f"module 'faults.bitflip' has no attribute {name!r}")


def flip_mask(bit: int, width: int) -> int:
    """``1 << bit`` as the signed integer of ``width`` bits (the top bit is negative)."""
    return -(1 << bit) if bit == width - 1 else 1 << bit


class BitflipSpec(GradientFaultSpec):
    """Flip a bit in a few elements of one matching tensor."""

    kind: Literal["bitflip"] = "bitflip"
    description: ClassVar[str] = (
        "Flip one bit in a few elements of a weight, grad or optimizer state."
    )
    fault_class: ClassVar[FaultClass] = "numeric"

    target: str = Field(
        default="*", min_length=1, description="Glob on parameter names; one match is picked."
    )
    tensor: Annotated[Literal["weights", "gradients", "optimizer_state"], Bias()] = Field(
        default="weights", description="Which tensor of the chosen parameter is hit."
    )
    bit: Annotated[Annotated[int, Field(ge=0, le=63)] | BitClass, Bias()] = Field(
        default="exponent",
        description="Bit position (checked against the dtype), or a class: a position in "
        "it is drawn (seeded).",
    )
    count: Annotated[int, Bias(upto=4)] = Field(
        default=1, ge=1, description="Distinct elements flipped."
    )
    state_key: Annotated[str, Bias(("exp_avg", "exp_avg_sq"), only=True)] = Field(
        default="exp_avg",
        min_length=1,
        description="Optimizer state entry (optimizer_state): exp_avg or exp_avg_sq for "
        "AdamW; state1 or state2, the stored 8-bit codes (give bit 0-7), for adamw8bit.",
    )


class BitflipInjector(GradientInjector[BitflipSpec]):
    """Gradients flip as backward accumulates them (see `faults.gradient`); weights and
    optimizer state just after the optimizer step."""

    def __init__(self, spec: BitflipSpec) -> None:
        super().__init__(spec)
        self._flips: dict[str, dict[str, Any]] = {}

    def gradient_params(self, ctx: StepContext) -> list[tuple[str, nn.Parameter]]:
        """The one parameter whose gradient flips, when gradients are the target."""
        return super().gradient_params(ctx) if self.spec.tensor == "gradients" else []

    def after_backward(self, ctx: StepContext) -> list[Injection]:
        """Report (or make) the gradient flip."""
        return super().after_backward(ctx) if self.spec.tensor == "gradients" else []

    def before_optimizer_step(self, ctx: StepContext) -> list[Injection]:
        """With ``at: before_step``: flip a gradient bit now."""
        return super().before_optimizer_step(ctx) if self.spec.tensor == "gradients" else []

    def after_optimizer_step(self, ctx: StepContext) -> list[Injection]:
        """Flip a weight or optimizer-state bit."""
        if self.spec.tensor == "gradients":
            return []
        name, t = self._pick(ctx, self._candidates(ctx))
        details = self._flip(ctx, name, t)
        return [Injection(fault=self.spec.kind, target=name, details=details)]

    # -- gradients (the GradientInjector hooks) -----------------------------------------

    def chosen(
        self, ctx: StepContext, candidates: list[tuple[str, nn.Parameter]]
    ) -> list[tuple[str, nn.Parameter]]:
        """One parameter, drawn (seeded) among those with at least ``count`` elements."""
        if not candidates:
            return []
        name, _ = self._pick(ctx, [(n, p.detach()) for n, p in candidates])
        return [(n, p) for n, p in candidates if n == name]

    def hit(self, ctx: StepContext, name: str, grad: torch.Tensor) -> int:
        """Flip the bit in ``count`` elements of the gradient."""
        self._flips[name] = self._flip(ctx, name, grad)
        return self.spec.count

    def details(self, ctx: StepContext, names: list[str]) -> dict[str, Any]:
        """What the flip did."""
        return self._flips[names[0]]

    def _report(self, ctx: StepContext) -> list[Injection]:
        records = super()._report(ctx)
        # One flip, one parameter: the record names it as the target.
        return [
            Injection(fault=r.fault, target=str(r.details["param"]), details=r.details)
            for r in records
        ]

    # -- choosing and flipping -----------------------------------------------------------

    def _candidates(self, ctx: StepContext) -> list[tuple[str, torch.Tensor]]:
        spec = self.spec
        model = require_model(ctx, spec.kind)
        matched = sorted(matching_parameters(model, spec.target), key=lambda item: item[0])
        found: list[tuple[str, torch.Tensor]] = []
        if spec.tensor == "weights":
            found = [(name, p.detach()) for name, p in matched]
        else:
            optimizer = require_optimizer(ctx, f"{spec.kind} on optimizer_state")
            for name, p in matched:
                value = optimizer.state.get(p, {}).get(spec.state_key)
                if isinstance(value, torch.Tensor):
                    found.append((name, value.detach()))
            if matched and not found:
                raise InjectionError(
                    f"bitflip: no parameter matching {spec.target!r} has optimizer state "
                    f"{spec.state_key!r} ({_present_keys(optimizer)})"
                )
        if not matched:
            names = [name for name, _ in model.named_parameters()]
            raise no_match(spec.kind, "parameter", spec.target, names)
        return found

    def _pick(
        self, ctx: StepContext, found: list[tuple[str, torch.Tensor]]
    ) -> tuple[str, torch.Tensor]:
        spec = self.spec
        # A tensor smaller than `count` cannot take `count` distinct flips.
        big_enough = [(name, t) for name, t in found if t.numel() >= spec.count]
        if not big_enough:
            raise InjectionError(
                f"bitflip: count={spec.count} but no {spec.tensor} tensor matching "
                f"{spec.target!r} has that many elements"
            )
        return seeded(spec.seed, spec.kind, ctx.step, ctx.rank, "param").choice(big_enough)

    def _flip(self, ctx: StepContext, name: str, t: torch.Tensor) -> dict[str, Any]:
        spec = self.spec
        key = (spec.seed, spec.kind, ctx.step, ctx.rank)
        layout = layouts().get(t.dtype)
        if layout is None and t.dtype in code_views():
            return self._flip_code(ctx, name, t)
        if layout is None:
            raise InjectionError(
                f"bitflip: {name} {spec.tensor} is {t.dtype}; supported: "
                + ", ".join(str(d) for d in [*layouts(), *code_views()])
            )
        if isinstance(spec.bit, int):
            if spec.bit >= layout.width:
                raise InjectionError(
                    f"bitflip: bit {spec.bit} is out of range for {t.dtype} of {name} "
                    f"({layout.width} bits: {layout.describe()})"
                )
            bit = spec.bit
        else:
            bit = seeded(*key, "bit").choice(layout.positions(spec.bit))
        indices = sorted(seeded(*key, "indices").sample(range(t.numel()), spec.count))
        values = as_1d_if_scalar(t)
        coords = flat_coords(t, torch.tensor(indices))
        ints = values.view(layout.as_int)
        mask = torch.tensor(flip_mask(bit, layout.width), dtype=layout.as_int, device=t.device)
        with torch.no_grad():
            before = values[coords].tolist()
            ints[coords] = ints[coords] ^ mask
            after = values[coords].tolist()
        details = {
            "param": name,
            "tensor": spec.tensor,
            "dtype": str(t.dtype).removeprefix("torch."),
            "bit": bit,
            "bit_class": layout.classify(bit),
            "indices": indices,
            "before": before,
            "after": after,
        }
        if spec.tensor == "optimizer_state":
            details["state_key"] = spec.state_key
        return details

    def _flip_code(self, ctx: StepContext, name: str, t: torch.Tensor) -> dict[str, Any]:
        """Flip bit ``spec.bit`` of the stored byte of ``count`` 8-bit codes."""
        spec = self.spec
        what = f"{spec.state_key} of {name}" if spec.tensor == "optimizer_state" else name
        if not (isinstance(spec.bit, int) and spec.bit < 8):
            raise InjectionError(
                f"bitflip: {what} is {t.dtype}, 8-bit codes with no sign, exponent or "
                f"mantissa; give bit as a position 0-7, got {spec.bit!r}"
            )
        indices = sorted(
            seeded(spec.seed, spec.kind, ctx.step, ctx.rank, "indices").sample(
                range(t.numel()), spec.count
            )
        )
        values = as_1d_if_scalar(t)
        coords = flat_coords(t, torch.tensor(indices))
        ints = values.view(code_views()[t.dtype])
        mask = torch.tensor(flip_mask(spec.bit, 8), dtype=torch.int8, device=t.device)
        with torch.no_grad():
            before = values[coords].tolist()
            ints[coords] = ints[coords] ^ mask
            after = values[coords].tolist()
        details: dict[str, Any] = {
            "param": name,
            "tensor": spec.tensor,
            "dtype": str(t.dtype).removeprefix("torch."),
            "bit": spec.bit,
            "bit_class": "code",
            "indices": indices,
            "before": before,
            "after": after,
        }
        if spec.tensor == "optimizer_state":
            details["state_key"] = spec.state_key
        return details


def _present_keys(optimizer: torch.optim.Optimizer) -> str:
    """What an optimizer's state holds, for an error that named a missing entry."""
    if not optimizer.state:
        return "keys present: none; state appears after the first optimizer step"
    keys = sorted({k for state in optimizer.state.values() for k in state})
    codes = sorted(
        {
            k
            for state in optimizer.state.values()
            for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.dtype in code_views()
        }
    )
    held = f"keys present: {', '.join(keys)}"
    if codes:
        held += f"; 8-bit codes (flip with bit: 0-7): {', '.join(codes)}"
    return held
