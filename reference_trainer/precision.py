"""fp32, bf16 and fp16 training: autocast for the forward pass, loss scaling for fp16."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(slots=True)
class Precision:
    """The autocast context and gradient scaler of one precision on one device."""

    name: str
    device_type: str
    scaler: torch.amp.GradScaler

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Forward-pass context: low-precision matmuls for bf16/fp16, nothing for fp32."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=_DTYPES[self.name])

    def loss_scale(self) -> float | None:
        """Current fp16 loss scale; None when the loss is not scaled."""
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else None


def build_precision(name: str, device: torch.device) -> Precision:
    """The precision ``name`` (fp32, bf16, fp16) on ``device``."""
    scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")
    return Precision(name, device.type, scaler)
