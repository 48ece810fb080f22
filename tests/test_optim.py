"""The optimizer recipe: exact epsilon and weight decay per group, and the LR schedule."""

from __future__ import annotations

import itertools
import math

import pytest

from reference_trainer.config import preset
from reference_trainer.errors import ConfigError
from reference_trainer.model.gpt import GPT
from reference_trainer.model.optim import build_optimizer, layer_of, lr_at, peak_lr


def _expected(name: str, dim: int) -> tuple[float, float]:
    """(eps, weight_decay) the recipe prescribes for one parameter, derived from its name."""
    if name.startswith(("wte.", "wpe.")):
        return 1e-6, 0.0
    eps = 1e-5 if (".attn." in name or ".ln_1." in name) else 1e-4
    is_norm_or_bias = ".ln_" in name or name.startswith("ln_f") or name.endswith(".bias")
    return eps, 0.0 if is_norm_or_bias else 0.1


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_every_parameter_gets_its_layered_eps_and_weight_decay(name: str) -> None:
    cfg = preset(name)
    model = GPT(cfg.model)
    opt = build_optimizer(model, cfg.optim)
    seen = {}
    for group in opt.param_groups:
        assert group["betas"] == (0.9, 0.95)
        for pname, p in zip(group["param_names"], group["params"], strict=True):
            seen[pname] = (group["eps"], group["weight_decay"], p.dim())
    # Every distinct parameter is in exactly one group (the tied head counted once).
    assert set(seen) == {n for n, _ in model.named_parameters()}
    for pname, (eps, wd, dim) in seen.items():
        assert (eps, wd) == _expected(pname, dim), pname
    # All three epsilons and both decays are actually in use.
    assert {e for e, _, _ in seen.values()} == {1e-6, 1e-5, 1e-4}
    assert {w for _, w, _ in seen.values()} == {0.0, 0.1}


def test_unknown_parameter_names_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"'head\.extra\.weight' belongs to no known layer"):
        layer_of("head.extra.weight")


def test_schedule_warms_up_then_follows_the_cosine_and_stays_flat() -> None:
    max_lr, warmup, total = 1e-2, 10, 100
    lrs = [lr_at(s, max_lr=max_lr, warmup_steps=warmup, total_steps=total) for s in range(total)]
    assert lrs[0] == pytest.approx(max_lr / warmup)
    assert lrs[warmup - 1] == pytest.approx(max_lr)
    assert all(a < b for a, b in itertools.pairwise(lrs[:warmup]))
    for step in range(warmup, total):
        formula = max_lr * 0.5 * (1 + math.cos(math.pi * min(step, 0.8 * total) / (0.8 * total)))
        assert lrs[step] == pytest.approx(formula, abs=1e-15)
    assert all(a >= b for a, b in itertools.pairwise(lrs[warmup:]))
    assert set(lrs[80:]) == {lrs[80]}  # flat over the last 20%


def test_peak_lr_scales_with_the_square_root_of_the_global_batch() -> None:
    cfg = preset("tiny")
    one = peak_lr(cfg, world_size=1)
    assert one == pytest.approx(cfg.optim.base_lr * math.sqrt(cfg.batch_size / 8))
    assert peak_lr(cfg, world_size=4) == pytest.approx(2 * one)


def test_the_cosine_ends_at_the_floor_and_stays_there() -> None:
    max_lr, warmup, total, ratio = 1e-2, 10, 100, 0.1
    lrs = [
        lr_at(s, max_lr=max_lr, warmup_steps=warmup, total_steps=total, min_lr_ratio=ratio)
        for s in range(total)
    ]
    assert all(a >= b for a, b in itertools.pairwise(lrs[warmup:]))
    assert lrs[80:] == [pytest.approx(ratio * max_lr)] * 20
    assert min(lrs[warmup:]) == pytest.approx(ratio * max_lr)
