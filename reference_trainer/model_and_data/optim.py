"""The optimizer recipe: AdamW parameter groups with layered epsilon, and the LR schedule."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from reference_trainer.config import OptimConfig, TrainConfig
from reference_trainer.errors import ConfigError

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
        from reference_trainer.model_and_data.adamw8bit import build_adamw8bit

        return build_adamw8bit(model, cfg)
    if cfg.name == "sophia":
        from reference_trainer.model_and_data.sophia import SophiaG

        groups = parameter_groups(model, cfg)
        return SophiaG(groups, lr=0.0, betas=(cfg.beta1, cfg.beta2), rho=cfg.sophia.rho)
    raise ConfigError(f"optim.name {cfg.name!r} has no builder in this trainer")


def peak_lr(cfg: TrainConfig, world_size: int) -> float:
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
