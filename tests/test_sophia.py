"""Sophia-G: the same updates as the published implementation, its state through a
checkpoint, its settings, and the Hessian estimate of the training step."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from sophia_opt import SophiaG as PublishedSophiaG

from harness.records.events import Detected
from reference_trainer.config import OptimConfig, TrainConfig, preset
from reference_trainer.errors import ConfigError
from reference_trainer.hessian_step import HessianBatch, HessianEstimator, sampled_labels
from reference_trainer.model.gpt import GPT, GPTConfig
from reference_trainer.model.optim import build_optimizer, parameter_groups, peak_lr
from reference_trainer.model.sophia import SophiaG
from reference_trainer.processes.distributed import Topology
from reference_trainer.stability.loss_scale import DynamicLossScaler, LossScaleConfig
from reference_trainer.stability.precision import Precision

TOKENS = 512  # the estimator's B: tokens in the batch the estimate is a mean over


def _params(seed: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in [(6, 5), (7,)]]


def _run(
    opt: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    hessian: Any,
    steps: int = 12,
) -> None:
    """``steps`` updates from seeded gradients, a Hessian estimate after every third one."""
    gen = torch.Generator().manual_seed(99)
    for step in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen) * 0.1
        opt.step(**({"bs": TOKENS} if isinstance(opt, PublishedSophiaG) else {}))
        if step % 3 == 0:
            for p in params:  # the sampled-label gradient
                p.grad = torch.randn(p.shape, generator=gen) * 0.1
            hessian(opt)


def _ours(params: list[torch.nn.Parameter], rho: float = 0.05) -> SophiaG:
    # The published implementation's fixed epsilon, so the two compare like for like.
    return SophiaG(params, lr=0.01, betas=(0.9, 0.95), rho=rho, weight_decay=0.1, eps=1e-15)


def test_updates_match_the_published_sophia_g() -> None:
    ours, theirs = _params(0), _params(0)
    opt = _ours(ours)
    _run(opt, ours, lambda o: o.update_hessian(TOKENS))
    published = PublishedSophiaG(theirs, lr=0.01, betas=(0.9, 0.95), rho=0.05, weight_decay=0.1)
    _run(published, theirs, lambda o: o.update_hessian())
    for a, b, start in zip(ours, theirs, _params(0), strict=True):
        assert not torch.allclose(a, start)  # it moved
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # Both clipped and unclipped elements were exercised: the comparison covers each branch.
    ratio = torch.cat(
        [(s["exp_avg"].abs() / (0.05 * s["hessian"])).flatten() for s in opt.state.values()]
    )
    assert (ratio < 1).any() and (ratio >= 1).any(), ratio


def test_the_comparison_sees_a_different_rho() -> None:
    """Negative control for the test above: a changed setting shows up in the updates."""
    ours, theirs = _params(0), _params(0)
    _run(_ours(ours, rho=0.5), ours, lambda o: o.update_hessian(TOKENS))
    published = PublishedSophiaG(theirs, lr=0.01, betas=(0.9, 0.95), rho=0.05, weight_decay=0.1)
    _run(published, theirs, lambda o: o.update_hessian())
    assert not torch.allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)


def test_state_survives_a_checkpoint_bit_exactly() -> None:
    straight = _params(1)
    opt = _ours(straight)
    _run(opt, straight, lambda o: o.update_hessian(TOKENS), steps=6)
    _continue(opt, straight)

    split = _params(1)
    first = _ours(split)
    _run(first, split, lambda o: o.update_hessian(TOKENS), steps=6)
    buffer = io.BytesIO()
    torch.save({"optimizer": first.state_dict(), "params": [p.detach() for p in split]}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # tensors and plain data only
    resumed = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    second = _ours(resumed)
    second.load_state_dict(saved["optimizer"])
    assert set(second.state[resumed[0]]) == {"step", "exp_avg", "hessian"}
    _continue(second, resumed)
    for a, b in zip(resumed, straight, strict=True):
        assert torch.equal(a, b)
    for x, y in zip(second.state.values(), opt.state.values(), strict=True):
        assert all(torch.equal(x[k], y[k]) for k in ("step", "exp_avg", "hessian"))


def _continue(opt: SophiaG, params: list[torch.nn.Parameter]) -> None:
    """Six more updates from gradients of their own seed, estimates after two of them."""
    gen = torch.Generator().manual_seed(7)
    for step in range(6):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen) * 0.1
        opt.step()
        if step % 3 == 0:
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen) * 0.1
            opt.update_hessian(TOKENS)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rho", 0.0, r"optim\.sophia\.rho must be a number > 0, got 0\.0"),
        ("lr_scale", -1.0, r"optim\.sophia\.lr_scale must be a number > 0"),
        ("hessian_every", 0, r"optim\.sophia\.hessian_every must be a positive integer, got 0"),
    ],
)
def test_bad_settings_are_refused_by_dotted_path(field: str, value: object, message: str) -> None:
    data = preset("tiny").to_dict()
    data["optim"]["sophia"] = {field: value}
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_dict(data)


def test_a_config_written_before_sophia_loads_with_its_defaults() -> None:
    data = preset("tiny").to_dict()
    del data["optim"]["sophia"]
    assert TrainConfig.from_dict(data).optim.sophia == OptimConfig().sophia


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16))


def test_sophia_gets_adamw_s_groups_its_betas_and_a_scaled_peak() -> None:
    cfg = preset("tiny")
    cfg.optim.name, cfg.optim.beta2 = "sophia", 0.98
    cfg.optim.sophia.lr_scale = 0.5
    model = _gpt()
    opt = build_optimizer(model, cfg.optim)
    assert isinstance(opt, SophiaG)
    expected = parameter_groups(model, cfg.optim)
    assert [(g["name"], g["eps"], g["weight_decay"]) for g in opt.param_groups] == [
        (g["name"], g["eps"], g["weight_decay"]) for g in expected
    ]
    assert all(g["betas"] == (cfg.optim.beta1, 0.98) for g in opt.param_groups)
    adamw = preset("tiny")
    assert peak_lr(cfg, 2) == pytest.approx(0.5 * peak_lr(adamw, 2))


def _trainer(model: GPT, *, guard: bool = True) -> Any:
    cfg = preset("tiny")
    cfg.optim.name = "sophia"
    cfg.stability.nonfinite_guard = guard
    return SimpleNamespace(
        cfg=cfg,
        model=model,
        wrapped=model,
        optimizer=build_optimizer(model, cfg.optim),
        scaler=DynamicLossScaler(LossScaleConfig(), active=False),
        precision=Precision("fp32", "cpu"),
        topo=Topology(rank=0, world_size=1, local_rank=0, restart=0, device=torch.device("cpu")),
    )


def _batch() -> HessianBatch:
    tokens = torch.randint(0, 64, (2, 4, 17), generator=torch.Generator().manual_seed(3))
    return HessianBatch.windows(tokens, world_size=1)


def _hessians(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [opt.state[p]["hessian"].clone() for g in opt.param_groups for p in g["params"]]


def test_the_estimate_follows_steps_one_and_every_kth_and_is_seeded_by_step() -> None:
    trainer = _trainer(_gpt())
    estimator = HessianEstimator.of(trainer)
    assert estimator is not None and estimator.every == 10
    assert [s for s in range(1, 32) if estimator.due(s)] == [1, 11, 21, 31]
    assert estimator.after_update(trainer, 2, _batch()) == []  # not due: nothing computed
    assert not trainer.optimizer.state
    assert estimator.after_update(trainer, 1, _batch()) == []
    first = _hessians(trainer.optimizer)
    assert all(torch.isfinite(h).all() for h in first) and any(h.sum() > 0 for h in first)
    assert all(p.grad is None for p in trainer.model.parameters())  # no gradient left behind

    again = _trainer(_gpt())
    estimator.after_update(again, 1, _batch())  # the same step draws the same labels
    assert all(torch.equal(a, b) for a, b in zip(first, _hessians(again.optimizer), strict=True))
    other = _trainer(_gpt())
    estimator.after_update(other, 11, _batch())
    assert not all(
        torch.equal(a, b) for a, b in zip(first, _hessians(other.optimizer), strict=True)
    )


def test_a_non_finite_estimate_is_dropped_and_claimed() -> None:
    trainer = _trainer(_gpt())
    estimator = HessianEstimator.of(trainer)
    assert estimator is not None
    estimator.after_update(trainer, 1, _batch())
    before = _hessians(trainer.optimizer)
    with torch.no_grad():
        trainer.model.blocks[0].mlp.fc.weight[0, 0] = float("nan")
    (claim,) = estimator.after_update(trainer, 11, _batch())
    assert isinstance(claim, Detected) and claim.detector == "nonfinite_guard"
    assert claim.details == {"hessian_estimate": "dropped"}
    after = _hessians(trainer.optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_without_the_guard_a_non_finite_estimate_poisons_the_average() -> None:
    """Negative control for the test above: the guard is what keeps the average finite."""
    trainer = _trainer(_gpt(), guard=False)
    estimator = HessianEstimator.of(trainer)
    assert estimator is not None
    with torch.no_grad():
        trainer.model.blocks[0].mlp.fc.weight[0, 0] = float("nan")
    assert estimator.after_update(trainer, 1, _batch()) == []
    assert not all(torch.isfinite(h).all() for h in _hessians(trainer.optimizer))


def test_sampled_labels_follow_the_softmax_and_skip_padding() -> None:
    logits = torch.log(torch.tensor([0.7, 0.2, 0.1])).expand(20_000, 3)
    targets = torch.zeros(20_000, dtype=torch.int64)
    targets[:5000] = -100  # padding
    labels = sampled_labels(logits, targets, torch.Generator().manual_seed(0))
    assert (labels[:5000] == -100).all()
    shares = torch.bincount(labels[5000:], minlength=3).float() / 15_000
    torch.testing.assert_close(shares, torch.tensor([0.7, 0.2, 0.1]), atol=0.015, rtol=0)
    nan = sampled_labels(torch.full((4, 3), float("nan")), targets[:4], torch.Generator())
    assert nan.shape == (4,)  # no error on non-finite logits: the loss carries the NaN
