"""Evidence of what a step did, read cheaply: did the parameters change (an update), were
the gradients cleared (an update given up)? Samples, compared bit for bit."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's own part of ``tensor``: the local shard of a DTensor (FSDP2, tensor
    parallel), whose own operations would run collectives, else the tensor itself."""
    # No DTensor exists unless its module was imported; importing it here would cost.
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(tensor, dtensor.DTensor):
        return tensor.to_local()  # type: ignore[no-any-return]
    return tensor


def _local_params(model: nn.Module) -> list[torch.Tensor]:
    return [t for t in (local(p.detach()) for p in model.parameters()) if t.numel()]


def _local_grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    grads = (local(p.grad.detach()) for p in params if p.grad is not None)
    return [g for g in grads if g.numel()]


class ParamSample:
    """A few elements of a few parameters, to tell cheaply whether an update happened.

    The first, the last and the largest trainable parameters, 32 elements each spread over
    the tensor, compared as raw bytes (a NaN equals itself)."""

    ELEMENTS = 32

    def __init__(self, model: nn.Module) -> None:
        params = [t for t in (local(p) for p in model.parameters() if p.requires_grad) if t.numel()]
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
    """True when every parameter of ``model`` (this rank's shard of it) is finite."""
    return _tensors_finite(_local_params(model))


#: The integer dtype with the same width as a float dtype, to read its bits.
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def params_fingerprint(model: nn.Module) -> int:
    """A 64-bit digest of every parameter's bits, in order: replicas holding bit-identical
    parameters agree, and one flipped bit anywhere changes it.

    Per tensor, the sum of its elements' bit patterns read as integers (flipping bit k of
    one element moves that sum by 2**k, so it cannot go unseen), in one pass and one sync;
    the sums are then hashed together.
    """
    params = _local_params(model)
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
    return _tensors_finite(_local_grads(model.parameters()))


def _optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def has_no_grads(optimizer: torch.optim.Optimizer) -> bool:
    """True when no parameter of ``optimizer`` has a gradient: its step changes nothing."""
    return all(p.grad is None for p in _optimizer_params(optimizer))


def creates_state(optimizer: torch.optim.Optimizer) -> bool:
    """True when a step of ``optimizer`` now could only create its state: every learning
    rate is 0, or every gradient is absent or zero (DCP's ``get_state_dict`` steps a fresh
    optimizer so, with zero gradients and lr 0)."""
    lrs = [group.get("lr") for group in optimizer.param_groups]
    if lrs and all(lr is not None and float(lr) == 0.0 for lr in lrs):
        return True
    grads = _local_grads(_optimizer_params(optimizer))
    with torch.no_grad():
        return all(not bool(torch.count_nonzero(g)) for g in grads)


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
