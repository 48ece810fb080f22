"""The optimizer recipe: its settings (`OptimConfig`), AdamW parameter groups with layered
epsilon, the optimizer they build, and the LR schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from harness.optimizers import OPTIMIZERS
from reference_trainer.errors import ConfigError
from reference_trainer.model.sophia import SophiaConfig, SophiaG


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    """AdamW with layered epsilon, warmup then cosine decay held flat for the last 20%."""

    name: str = "adamw"
    """Which optimizer: one of `harness.optimizers.OPTIMIZERS`."""
    base_lr: float = 3e-3
    """Peak learning rate at the reference batch size."""
    reference_batch: int = 8
    """Global batch (sequences) at which the peak learning rate is `base_lr`; other batch
    sizes scale it by sqrt(global_batch / reference_batch)."""
    warmup_steps: int = 10
    """Steps of linear warmup from 0 to the peak."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices; never on norms, biases or embeddings."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps_embedding: float = 1e-6
    eps_attention: float = 1e-5
    eps_feed_forward: float = 1e-4
    sophia: SophiaConfig = field(default_factory=SophiaConfig)
    """Sophia's own settings, read when `name` is ``sophia`` (docs/stability.md)."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError(
                f"optim.name must be one of {', '.join(OPTIMIZERS)}, got {self.name!r}"
            )
        for name in ("base_lr", "eps_embedding", "eps_attention", "eps_feed_forward"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"optim.{name} must be > 0, got {getattr(self, name)}")
        if not (isinstance(self.reference_batch, int) and self.reference_batch > 0):
            raise ConfigError(
                f"optim.reference_batch must be a positive integer, got {self.reference_batch!r}"
            )
        for name in ("warmup_steps", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"optim.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")


class BatchedRun(Protocol):
    """What `peak_lr` reads of a run's configuration (`reference_trainer.config.TrainConfig`)."""

    @property
    def optim(self) -> OptimConfig: ...

    def global_batch(self, world_size: int) -> int: ...


#: Which layer a parameter belongs to, by the first part of its name that matches.
#: A block's pre-norm belongs to the sublayer it feeds; the final norm to the output side
#: of the last feed-forward sublayer.
_LAYER_OF = (
    (".wte.", "embedding"),
    (".wpe.", "embedding"),
    (".ln_1.", "attention"),
    (".attn.", "attention"),
    (".ln_2.", "feed_forward"),
    (".mlp.", "feed_forward"),
    (".ln_f.", "feed_forward"),
)


def layer_of(name: str) -> str:
    """The layer (embedding, attention or feed_forward) a parameter name belongs to."""
    dotted = f".{name}."
    for marker, layer in _LAYER_OF:
        if marker in dotted:
            return layer
    raise ConfigError(f"parameter {name!r} belongs to no known layer; update optim._LAYER_OF")


def decays(name: str, param: torch.Tensor) -> bool:
    """Weight decay applies to matrices only: never norms, biases or embeddings."""
    return param.dim() >= 2 and layer_of(name) != "embedding"


def parameter_groups(model: nn.Module, cfg: OptimConfig) -> list[dict[str, Any]]:
    """AdamW groups: one per (layer, decays) pair, each with its epsilon and weight decay."""
    eps = {
        "embedding": cfg.eps_embedding,
        "attention": cfg.eps_attention,
        "feed_forward": cfg.eps_feed_forward,
    }
    groups: dict[tuple[str, bool], dict[str, Any]] = {}
    for name, param in model.named_parameters():  # tied weights are listed once
        if not param.requires_grad:
            continue
        layer, decay = layer_of(name), decays(name, param)
        group = groups.setdefault(
            (layer, decay),
            {
                "name": f"{layer}.{'decay' if decay else 'no_decay'}",
                "params": [],
                "param_names": [],
                "eps": eps[layer],
                "weight_decay": cfg.weight_decay if decay else 0.0,
            },
        )
        group["params"].append(param)
        group["param_names"].append(name)
    return list(groups.values())


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer ``cfg.name`` over `parameter_groups`; learning rates are set per step."""
    if cfg.name == "adamw":
        return torch.optim.AdamW(
            parameter_groups(model, cfg), lr=0.0, betas=(cfg.beta1, cfg.beta2), foreach=True
        )
    if cfg.name == "adamw8bit":  # imported here: only its runs need bitsandbytes
        from reference_trainer.model.adamw8bit import AdamW8bit, full_precision_params

        return AdamW8bit(
            parameter_groups(model, cfg),
            lr=0.0,
            betas=(cfg.beta1, cfg.beta2),
            full_precision=full_precision_params(model),
        )
    if cfg.name == "sophia":
        groups = parameter_groups(model, cfg)
        return SophiaG(groups, lr=0.0, betas=(cfg.beta1, cfg.beta2), rho=cfg.sophia.rho)
    raise ConfigError(f"optim.name {cfg.name!r} has no builder in this trainer")


def peak_lr(cfg: BatchedRun, world_size: int) -> float:
    """Peak learning rate, scaled by sqrt(global batch / reference batch) (and by Sophia's
    ``lr_scale`` for Sophia)."""
    ratio = cfg.global_batch(world_size) / cfg.optim.reference_batch
    scale = cfg.optim.sophia.lr_scale if cfg.optim.name == "sophia" else 1.0
    return cfg.optim.base_lr * math.sqrt(ratio) * scale


def lr_at(
    step: int, *, max_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> float:
    """Learning rate of 0-based ``step``: linear warmup, then cosine decay from ``max_lr`` to
    ``min_lr = min_lr_ratio * max_lr``, reached at 80% of ``total_steps`` and kept there:
    ``min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi * min(step, 0.8 T) / (0.8 T)))``.
    With ``min_lr_ratio`` 0 the last 20% trains at learning rate 0, that is, not at all."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    horizon = 0.8 * total_steps
    min_lr = min_lr_ratio * max_lr
    cosine = 0.5 * (1 + math.cos(math.pi * min(step, horizon) / horizon))
    return min_lr + (max_lr - min_lr) * cosine
