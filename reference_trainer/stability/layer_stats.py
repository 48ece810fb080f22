"""Per-layer statistics of every step: what each layer's gradients, weights, updates and
activations did, cheap enough to take at every step (one pass over the gradients and two
over the weights; two reductions per activation), journaled every few steps and on every
anomaly.

A *layer* here is a unit a user would name: ``embedding`` (token and position tables),
``blocks.N`` (one transformer block), ``ln_f`` (the final norm). Per layer:

- ``grad_norm``: L2 norm of its gradients after unscaling, before clipping;
- ``nonzero``: share of its gradient elements that are not exactly zero (a gradient
  flushed to zero by fp16 underflow shows here first);
- ``weight_norm``: L2 norm of its weights before the update (a change made outside the
  optimizer, such as a flipped bit, shows here);
- ``update_ratio``: ``||w_after - w_before|| / ||w_before||`` of the update (0 when the
  step was skipped);
- ``act_max`` and ``act_rms``: largest absolute value and root mean square of the
  residual stream it hands on (for ``embedding`` and ``blocks.N``), over the
  micro-batches of the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from reference_trainer.errors import ConfigError

SIGNALS = ("grad_norm", "nonzero", "weight_norm", "update_ratio", "act_max", "act_rms")


@dataclass(kw_only=True, slots=True)
class LayerStatsConfig:
    """Per-layer statistics, the swing detector and the diagnosis of the problem layer."""

    enabled: bool = True
    journal_every: int = 10
    """Journal a `layer_stats` event every this many steps (and at every anomaly)."""
    history: int = 20
    """Recent values per layer and signal whose median is the layer's own norm."""
    min_history: int = 10
    """Values needed before a layer's swing may be judged."""
    swing_factor: float = 1000.0
    """A gradient norm this many times above (or below) the layer's median is a swing
    (three orders of magnitude: a tiny run's own batches move one block's gradient norm up
    to about 130x its median now and then)."""
    diagnose_factor: float = 10.0
    """A signal this many times off the layer's median is evidence in a diagnosis."""

    def __post_init__(self) -> None:
        p = "stability.layer_stats."
        if self.journal_every < 1 or self.history < 1 or self.min_history < 1:
            raise ConfigError(p + "journal_every, history and min_history must be >= 1")
        if self.min_history > self.history:
            raise ConfigError(
                f"{p}min_history ({self.min_history}) must be <= history ({self.history})"
            )
        for name in ("swing_factor", "diagnose_factor"):
            if not getattr(self, name) > 1:
                raise ConfigError(f"{p}{name} must be > 1, got {getattr(self, name)}")


def layer_name(param_name: str) -> str:
    """The layer a parameter belongs to: ``embedding``, ``blocks.N`` or its top module."""
    parts = param_name.split(".")
    if parts[0] in ("wte", "wpe"):
        return "embedding"
    if parts[0] == "blocks" and len(parts) > 1:
        return f"blocks.{parts[1]}"
    return parts[0]


@dataclass(slots=True)
class StepStats:
    """One step's statistics, by layer and signal (floats; missing signals absent)."""

    step: int
    layers: dict[str, dict[str, float]] = field(default_factory=dict)

    def value(self, layer: str, signal: str) -> float | None:
        """One figure, or None when it was not measured."""
        return self.layers.get(layer, {}).get(signal)

    def to_json(self) -> dict[str, dict[str, float | None]]:
        """JSON-ready: non-finite figures become null, with a flag of which."""
        out: dict[str, dict[str, float | None]] = {}
        for layer, signals in self.layers.items():
            out[layer] = {k: (v if math.isfinite(v) else None) for k, v in signals.items()}
        return out


class LayerStats:
    """Collects one step's per-layer statistics from hooks and from the trainer's calls:
    ``gradients()`` after unscaling, ``before_update()`` and ``after_update()`` around
    the optimizer step, ``finish()`` at the end of the step."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module], final: nn.Module) -> None:
        self.params: dict[str, list[torch.nn.Parameter]] = {}
        for name, param in model.named_parameters():
            self.params.setdefault(layer_name(name), []).append(param)
        self.order = list(self.params)  # forward order of the layers
        # The residual stream each layer hands on is the input of the next one, seen by a
        # pre-hook there: it includes whatever any hook of the layer itself did to it.
        receivers = [*blocks, final]
        senders = ["embedding", *(f"blocks.{i}" for i in range(len(blocks)))]
        self._handles = [
            module.register_forward_pre_hook(self._hook(name))
            for name, module in zip(senders, receivers, strict=True)
        ]
        self._act: dict[str, list[torch.Tensor]] = {}
        self._before: list[torch.Tensor] | None = None
        self._current = StepStats(0)

    def _hook(self, layer: str) -> Any:
        def record(module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0].detach()
            peak = x.abs().amax().float()
            mean_square = x.float().square().mean()
            prev = self._act.get(layer)
            if prev is None:
                self._act[layer] = [peak, mean_square, torch.ones(())]
            else:
                prev[0] = torch.maximum(prev[0], peak)
                prev[1] = prev[1] + mean_square
                prev[2] = prev[2] + 1

        return record

    @property
    def current(self) -> StepStats:
        """The step's statistics so far."""
        return self._current

    def begin(self, step: int) -> None:
        """A new step: forget the last one's figures."""
        self._current = StepStats(step)
        self._act.clear()
        self._before = None

    def gradients(self) -> dict[str, float]:
        """Record each layer's gradient norm and non-zero share (after unscaling), and its
        weight norm (before any update); returns the gradient norms by layer."""
        norms = {}
        for layer, params in self.params.items():
            grads = [p.grad for p in params if p.grad is not None]
            entry = self._current.layers.setdefault(layer, {})
            entry["weight_norm"] = _norm([p.detach() for p in params])
            if not grads:
                continue
            per = torch.stack([torch.linalg.vector_norm(g.float(), 2.0) for g in grads])
            norm = float(torch.linalg.vector_norm(per, 2.0))
            nonzero = sum(int(torch.count_nonzero(g)) for g in grads)
            entry["grad_norm"] = norm
            entry["nonzero"] = nonzero / sum(g.numel() for g in grads)
            norms[layer] = norm
        return norms

    def before_update(self) -> None:
        """A copy of the weights, just before the optimizer step."""
        self._before = [p.detach().clone() for params in self.params.values() for p in params]

    def after_update(self, skipped: bool) -> None:
        """Each layer's update ratio (0 when the update was skipped)."""
        before, self._before = self._before, None
        at = 0
        for layer, params in self.params.items():
            entry = self._current.layers.setdefault(layer, {})
            mine, at = (before or [])[at : at + len(params)], at + len(params)
            weight = entry.get("weight_norm", 0.0)
            if skipped or not mine or not weight > 0:
                entry["update_ratio"] = 0.0
                continue
            torch._foreach_sub_(mine, [p.detach() for p in params])  # the copy becomes -delta
            entry["update_ratio"] = _norm(mine) / weight

    def finish(self) -> StepStats:
        """The step's statistics, activations included."""
        for layer, (peak, mean_square, count) in self._act.items():
            entry = self._current.layers.setdefault(layer, {})
            entry["act_max"] = float(peak)
            entry["act_rms"] = math.sqrt(float(mean_square / count))
        self._act.clear()
        return self._current

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _norm(tensors: list[torch.Tensor]) -> float:
    if not tensors:
        return 0.0
    per = torch._foreach_norm([t.float() for t in tensors], 2.0)
    return float(torch.linalg.vector_norm(torch.stack(per), 2.0))
