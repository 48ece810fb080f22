"""fp32, bf16 and fp16 training: autocast for the forward pass (loss scaling for fp16
lives in `reference_trainer.stability.loss_scale`).

On a CPU, PyTorch multiplies fp16 and bf16 matrices with a generic kernel (no BLAS takes
them on most CPUs): a tiny model's fp16 step took 0.31 s there, against 0.05 s in fp32.
`Precision.kernels` computes those products as a GPU's tensor cores do, from the
low-precision inputs autocast made, accumulated in fp32, rounded once to the low
precision: the CPU kernel's own arithmetic (it accumulates in fp32 too), summed in
another order, so at most the last bit of an element differs. Overflow shows as before:
a sum past fp16's largest value rounds to inf.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_aten = torch.ops.aten
#: The matrix products, and where each takes its first matrix.
_PRODUCTS = {
    _aten.mm.default: 0,
    _aten.bmm.default: 0,
    _aten.addmm.default: 1,
    _aten.baddbmm.default: 1,
}


class _ProductsInFloat32(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Low-precision matrix products on CPU: inputs to fp32, product, result rounded back."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        first = _PRODUCTS.get(func)
        if first is not None:
            low = args[first].dtype
            if low in (torch.float16, torch.bfloat16):
                wide = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
                return func(*wide, **kwargs).to(low)
        return func(*args, **kwargs)


@dataclass(frozen=True, slots=True)
class Precision:
    """The autocast context of one precision on one device."""

    name: str
    device_type: str

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Forward-pass context: low-precision matmuls for bf16/fp16, nothing for fp32."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=_DTYPES[self.name])

    def kernels(self) -> contextlib.AbstractContextManager[Any]:
        """Around a forward and backward pass: on CPU, bf16/fp16 matrix products computed
        in fp32 and rounded back (the module's docstring); nothing elsewhere."""
        if self.name == "fp32" or self.device_type != "cpu":
            return contextlib.nullcontext()
        return _ProductsInFloat32()  # type: ignore[no-untyped-call]
