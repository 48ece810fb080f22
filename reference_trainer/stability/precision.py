"""fp32, bf16 and fp16 training: autocast for the forward pass (loss scaling for fp16
lives in `reference_trainer.stability.loss_scale`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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
