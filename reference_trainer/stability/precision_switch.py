"""Dynamic precision switching: a block whose activations near the fp16 limit runs in fp32.

Forward hooks record each block's largest absolute output. When one reaches
``threshold`` of the fp16 maximum (65504), or is not finite, the block switches to fp32
from the next step on; after at least ``window`` steps, and ``safe_steps`` steps in a row
with its maximum below half the threshold, it switches back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from reference_trainer.errors import ConfigError
from reference_trainer.model.gpt import Block

FP16_MAX = 65504.0


@dataclass(kw_only=True, slots=True)
class PrecisionSwitchConfig:
    """Per-block fp16 -> fp32 switching (fp16 runs only)."""

    enabled: bool = True
    threshold: float = 0.25
    """Share of the fp16 maximum at which a block moves to fp32."""
    window: int = 50
    """Steps a switched block stays in fp32 at least."""
    safe_steps: int = 20
    """Steps in a row under half the threshold before switching back."""

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ConfigError(
                f"stability.precision_switch.threshold must be in (0, 1], got {self.threshold}"
            )
        if self.window < 1 or self.safe_steps < 1:
            raise ConfigError("stability.precision_switch.window and safe_steps must be >= 1")


@dataclass(frozen=True, slots=True)
class Switch:
    """One block moved between precisions, with the figure that moved it."""

    layer: str
    to: str  # "fp32" or "fp16"
    max_abs: float


@dataclass(slots=True)
class _BlockState:
    switched_at: int | None = None
    calm_steps: int = 0


@dataclass(slots=True)
class ActivationMonitor:
    """Watches block outputs and flips blocks' ``fp32`` flags."""

    config: PrecisionSwitchConfig
    blocks: dict[str, Block]
    _maxima: dict[str, torch.Tensor] = field(default_factory=dict)
    _state: dict[str, _BlockState] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, block in self.blocks.items():
            self._state[name] = _BlockState()
            self._handles.append(block.register_forward_hook(self._hook(name)))

    def _hook(self, name: str) -> Any:
        def record(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            peak = output.detach().abs().amax().float()
            # Keep the largest over the micro-batches of the step.
            prev = self._maxima.get(name)
            self._maxima[name] = peak if prev is None else torch.maximum(prev, peak)

        return record

    def end_step(self, step: int) -> list[Switch]:
        """Decide switches from this step's maxima; they apply from the next step."""
        limit = self.config.threshold * FP16_MAX
        switches = []
        for name, peak_t in self._maxima.items():
            peak = float(peak_t)
            block, state = self.blocks[name], self._state[name]
            hot = not peak < limit  # NaN counts as hot
            if not block.fp32:
                if hot:
                    block.fp32 = True
                    state.switched_at, state.calm_steps = step, 0
                    switches.append(Switch(name, "fp32", peak))
                continue
            state.calm_steps = state.calm_steps + 1 if peak < limit / 2 else 0
            assert state.switched_at is not None
            if step - state.switched_at >= self.config.window and (
                state.calm_steps >= self.config.safe_steps
            ):
                block.fp32 = False
                state.switched_at = None
                switches.append(Switch(name, "fp16", peak))
        self._maxima.clear()
        return switches

    def state_dict(self) -> dict[str, Any]:
        """Which blocks run in fp32 and since when."""
        return {
            name: {
                "fp32": bool(self.blocks[name].fp32),
                "switched_at": s.switched_at,
                "calm_steps": s.calm_steps,
            }
            for name, s in self._state.items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""
        for name, entry in state.items():
            self.blocks[name].fp32 = bool(entry["fp32"])
            self._state[name] = _BlockState(entry["switched_at"], int(entry["calm_steps"]))

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
