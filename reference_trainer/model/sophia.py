"""Sophia-G (Liu et al. 2023): momentum over a diagonal Hessian estimate, clipped per element.

Each step, for each parameter ``theta`` with gradient ``g``:

    m     = beta1 * m + (1 - beta1) * g                      (state ``exp_avg``)
    theta = theta * (1 - lr * weight_decay)                  (decoupled weight decay)
    theta = theta - lr * sign(m) * min(|m| / (rho * h + eps), 1)

Every k steps the training step hands in a Gauss-Newton-Bartlett estimate (labels sampled
from the model's own softmax, the gradient ``g_hat`` of their loss, mean over the batch's
``B`` tokens) and the optimizer keeps its moving average (state ``hessian``):

    h = beta2 * h + (1 - beta2) * B * g_hat ** 2

The published implementation keeps the average of ``g_hat ** 2`` and multiplies by a fixed
``B`` at each update; folding ``B`` into the average gives the same update with a constant
batch, and stays right when the batch's token count changes (dynamic batching). No bias
correction, as published: before the average has settled, ``h`` is small and the update is
mostly clipped, that is, ``lr * sign(m)``. The per-element update is at most ``lr``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from reference_trainer.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class SophiaConfig:
    """Sophia's own settings; the betas, the weight decay, the layered epsilon and the
    schedule are the optimizer's shared ones (`OptimConfig`)."""

    rho: float = 0.05
    """Scale of the Hessian in the clipped ratio ``|m| / (rho * h + eps)``: smaller is a
    larger, more often clipped step (the published GPT-2 runs use 0.03 to 0.05)."""
    hessian_every: int = 10
    """k: the Hessian is estimated after steps 1, 1 + k, 1 + 2k, ... (one more forward and
    backward pass, and its all-reduce, each time)."""
    lr_scale: float = 0.5
    """Sophia's peak learning rate is this times the AdamW peak of `OptimConfig.base_lr`.
    A clipped element steps by the full learning rate, more than Adam's typical step, so
    Sophia runs lower (at 1.0 one seed of the tiny preset spiked to twice its loss at step
    17; at 0.5 three seeds train to within 0.1 of AdamW's loss: docs/stability.md)."""

    def __post_init__(self) -> None:
        for name in ("rho", "lr_scale"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0 and value < float("inf")):
                raise ConfigError(f"optim.sophia.{name} must be a number > 0, got {value!r}")
        every = self.hessian_every
        if not (isinstance(every, int) and not isinstance(every, bool) and every > 0):
            raise ConfigError(
                f"optim.sophia.hessian_every must be a positive integer, got {every!r}"
            )


class SophiaG(torch.optim.Optimizer):
    """Sophia-G with decoupled weight decay; `update_hessian` takes the estimate from the
    parameters' gradients (the trainer computes them: `reference_trainer.hessian_step`).

    State per parameter, all tensors: ``step`` (updates taken), ``exp_avg`` (momentum) and
    ``hessian`` (the moving average of the estimates)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        *,
        lr: float = 0.0,
        betas: tuple[float, float] = (0.965, 0.99),
        rho: float = 0.05,
        weight_decay: float = 0.1,
        eps: float = 1e-15,
    ) -> None:
        for name, value in (("lr", lr), ("rho", rho), ("weight_decay", weight_decay)):
            if not value >= 0:
                raise ValueError(f"SophiaG: {name} must be >= 0, got {value}")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"SophiaG: betas must be in [0, 1), got {betas}")
        if not eps > 0:
            raise ValueError(f"SophiaG: eps must be > 0, got {eps}")
        defaults = {"lr": lr, "betas": betas, "rho": rho, "weight_decay": weight_decay, "eps": eps}
        super().__init__(params, defaults)

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["hessian"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update from the parameters' gradients (``closure``: recomputes the loss)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, _), rho = group["lr"], group["betas"], group["rho"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("SophiaG does not support sparse gradients")
                state = self._state(p)
                exp_avg, hessian = state["exp_avg"], state["hessian"]
                state["step"] += 1
                p.mul_(1 - lr * group["weight_decay"])
                exp_avg.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                ratio = (exp_avg.abs() / (rho * hessian + group["eps"])).clamp_(max=1)
                p.addcmul_(exp_avg.sign(), ratio, value=-lr)
        return loss

    @torch.no_grad()
    def update_hessian(self, tokens: int) -> None:
        """Fold the estimate ``tokens * grad ** 2`` into each parameter's moving average:
        the parameters' gradients are those of the sampled-label loss (a mean over the
        batch's ``tokens`` tokens), already averaged over ranks."""
        for group in self.param_groups:
            beta2 = group["betas"][1]
            for p in group["params"]:
                if p.grad is None:
                    continue
                hessian = self._state(p)["hessian"]
                hessian.mul_(beta2).addcmul_(p.grad, p.grad, value=(1 - beta2) * tokens)
