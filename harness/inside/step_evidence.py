"""Evidence of what a step did, read cheaply: did the parameters change (an update), were
the gradients cleared (an update given up)? Samples, compared bit for bit."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


class ParamSample:
    """A few elements of a few parameters, to tell cheaply whether an update happened.

    The first, the last and the largest trainable parameters, 32 elements each spread over
    the tensor, compared as raw bytes (a NaN equals itself)."""

    ELEMENTS = 32

    def __init__(self, model: nn.Module) -> None:
        params = [p for p in model.parameters() if p.requires_grad and p.numel()]
        chosen = {id(p): p for p in [*params[:1], *params[-1:]]}
        if params:
            largest = max(params, key=lambda p: p.numel())
            chosen[id(largest)] = largest
        self.params = list(chosen.values())
        self._saved: list[torch.Tensor] = []

    def _now(self) -> list[torch.Tensor]:
        with torch.no_grad():
            out = []
            for p in self.params:
                flat = p.detach().reshape(-1)
                stride = max(1, flat.numel() // self.ELEMENTS)
                out.append(flat[::stride][: self.ELEMENTS].clone())
            return out

    def take(self) -> None:
        """Remember the parameters as they are now."""
        self._saved = self._now()

    def changed(self) -> bool:
        """True when any sampled element differs, bit for bit, from what `take` saw."""
        now = self._now()
        return any(
            not torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            for a, b in zip(now, self._saved, strict=True)
        )

    def finite(self) -> bool:
        """True when every sampled element is finite."""
        return all(bool(torch.isfinite(t).all()) for t in self._saved)


@dataclass(frozen=True, slots=True)
class GradMark:
    """One gradient as a backward left it, to tell later whether it was cleared: gone,
    replaced, or changed in place (``zero_grad`` without set_to_none, a clip), which its
    version counter shows without reading a byte of it."""

    param: torch.Tensor
    grad: torch.Tensor
    version: int

    @classmethod
    def of(cls, model: nn.Module, last: GradMark | None) -> GradMark | None:
        """A mark of the last parameter that has a gradient (the one marked before, if any)."""
        param = last.param if last is not None and last.param.grad is not None else None
        if param is None:
            param = next(
                (p for p in reversed(list(model.parameters())) if p.grad is not None), None
            )
        if param is None or param.grad is None:
            return None
        return cls(param, param.grad, param.grad._version)

    def cleared(self) -> bool:
        """True when the gradient is gone, replaced or changed since the mark."""
        grad = self.param.grad
        return grad is None or grad is not self.grad or grad._version != self.version


def params_finite(model: nn.Module) -> bool:
    """True when every parameter of ``model`` is finite."""
    return _tensors_finite([p.detach() for p in model.parameters() if p.numel()])


#: The integer dtype with the same width as a float dtype, to read its bits.
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def params_fingerprint(model: nn.Module) -> int:
    """A 64-bit digest of every parameter's bits, in order: replicas holding bit-identical
    parameters agree, and one flipped bit anywhere changes it.

    Per tensor, the sum of its elements' bit patterns read as integers (flipping bit k of
    one element moves that sum by 2**k, so it cannot go unseen), in one pass and one sync;
    the sums are then hashed together.
    """
    params = [p.detach() for p in model.parameters() if p.numel()]
    if not params:
        return 0
    with torch.no_grad():
        sums = torch.stack(
            [t.contiguous().view(_BITS[t.element_size()]).sum(dtype=torch.int64) for t in params]
        )
    digest = hashlib.blake2b(sums.cpu().numpy().tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def grads_finite(model: nn.Module) -> bool:
    """True when every gradient of ``model`` is finite (no gradient counts as finite)."""
    params = model.parameters()
    return _tensors_finite([p.grad.detach() for p in params if p.grad is not None and p.numel()])


def _tensors_finite(tensors: list[torch.Tensor]) -> bool:
    if not tensors:
        return True
    with torch.no_grad():
        # Fast: a NaN or an infinity makes its tensor's norm non-finite (one fused read per
        # tensor, one sync). Only a non-finite norm needs the exact look, since finite
        # values past ~1e19 overflow a float32 norm too.
        norms = torch._foreach_norm(tensors, 2.0)
        if _all_finite(norms):
            return True
        return all(bool(torch.isfinite(t).all()) for t in tensors)


def _all_finite(values: Sequence[torch.Tensor]) -> bool:
    """True when every one of these scalars is finite (true), one sync per device."""
    devices: dict[torch.device, list[torch.Tensor]] = {}
    for value in values:
        devices.setdefault(value.device, []).append(value.float())
    return all(bool(torch.isfinite(torch.stack(group)).all()) for group in devices.values())
