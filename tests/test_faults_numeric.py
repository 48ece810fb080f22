"""Numeric faults act on a real model: each test observes the effect, not the bookkeeping."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from faults import FaultSpecError, InjectionError, StepContext, build_injector, kinds, parse_fault
from faults.bitflip import LAYOUTS, BitflipSpec
from faults.injector import Injection, Injector
from faults.tensors import share

VOCAB, D = 32, 16
NUMERIC = [
    "nan_grad",
    "inf_grad",
    "bitflip",
    "activation_overflow",
    "grad_underflow",
    "grad_spike",
]
LOSS_SPIKE = ["lr_spike", "bad_batch"]


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, D)
        self.proj = nn.Linear(D, D)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.tanh(self.qkv(h)))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, 2 * D)
        self.proj = nn.Linear(2 * D, D)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.fc(h)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = Attn()
        self.mlp = MLP()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.ln(h))
        return h + self.mlp(h)


class TinyLM(nn.Module):
    """Named like the reference GPT: wte, blocks.N.attn / blocks.N.mlp, head."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.wte(idx)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def make_model(seed: int = 0) -> TinyLM:
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = TinyLM()
    torch.random.set_rng_state(gen_state)
    return model


def tokens(shape: tuple[int, ...], vocab: int = VOCAB, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def backward(model: nn.Module) -> None:
    batch = tokens((4, 9))
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    loss.backward()  # type: ignore[no-untyped-call]


def ctx(
    model: nn.Module | None, opt: torch.optim.Optimizer | None = None, step: int = 5, rank: int = 0
) -> StepContext:
    return StepContext(step=step, rank=rank, world_size=2, model=model, optimizer=opt)


def injector(**fields: Any) -> Injector[Any]:
    return build_injector(parse_fault({"at_step": 1, **fields}))


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def raw(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor, as int64 (copy)."""
    return t.detach().view(LAYOUTS[t.dtype].as_int).to(torch.int64).clone()


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from threads; on a busy machine they cost seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def model() -> TinyLM:
    return make_model()


@pytest.fixture
def stepped() -> tuple[TinyLM, torch.optim.AdamW]:
    """A model after one real AdamW step, with fresh gradients from a second backward."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    backward(model)
    opt.step()
    opt.zero_grad()
    backward(model)
    return model, opt


# -- nan_grad / inf_grad -------------------------------------------------------------------


def test_nan_grad_hits_exactly_the_targeted_gradients(model: TinyLM) -> None:
    backward(model)
    clean = grads(model)
    records = injector(kind="nan_grad", target="blocks.0.attn.*").after_backward(ctx(model))
    hit = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.isnan().any()}
    assert hit == {n for n in clean if n.startswith("blocks.0.attn.")} and len(hit) == 4
    for name, p in model.named_parameters():
        assert p.grad is not None
        if name in hit:
            assert p.grad.isnan().all()
        else:
            assert torch.equal(p.grad, clean[name])
    assert records[0].details["params"] == sorted(hit)
    assert records[0].details["elements"] == sum(clean[n].numel() for n in hit)


def test_nan_grad_fraction_hits_ceil_of_the_share(model: TinyLM) -> None:
    # The count is ceil(fraction * numel): 0.33 * 256 = 84.48 -> 85 (round would give 84),
    # 0.33 * 16 = 5.28 -> 6.
    backward(model)
    inj = injector(kind="nan_grad", target="blocks.1.attn.qkv.*", fraction=0.33)
    records = inj.after_backward(ctx(model))
    qkv = model.blocks[1].attn.qkv
    assert qkv.weight.grad is not None and qkv.bias.grad is not None
    assert int(qkv.weight.grad.isnan().sum()) == 85
    assert int(qkv.bias.grad.isnan().sum()) == 6
    assert records[0].details["elements"] == 91
    assert share(0.1, 30) == 3 and share(1e-9, 10) == 1 and share(1.0, 7) == 7


def test_inf_grad_writes_positive_infinity(model: TinyLM) -> None:
    backward(model)
    injector(kind="inf_grad", target="head.bias", fraction=0.5).after_backward(ctx(model))
    g = model.head.bias.grad
    assert g is not None
    assert int(torch.isposinf(g).sum()) == VOCAB // 2
    assert int(torch.isfinite(g).sum()) == VOCAB // 2
    assert model.head.weight.grad is not None and torch.isfinite(model.head.weight.grad).all()


def test_grad_faults_skip_params_without_grad_and_name_the_pattern(model: TinyLM) -> None:
    with pytest.raises(InjectionError, match=r"gradient matches target 'head\.\*'"):
        injector(kind="nan_grad", target="head.*").after_backward(ctx(model))  # no backward yet
    model.wte.weight.requires_grad_(False)
    backward(model)
    assert model.wte.weight.grad is None
    rec = injector(kind="nan_grad", target="*").after_backward(ctx(model))[0]
    assert "wte.weight" not in rec.details["params"]
    with pytest.raises(InjectionError, match=r"'decoder\.\*'.*available: wte\.weight, blocks"):
        injector(kind="inf_grad", target="decoder.*").after_backward(ctx(model))
    with pytest.raises(InjectionError, match="needs the model"):
        injector(kind="nan_grad").after_backward(ctx(None))


# -- bitflip -------------------------------------------------------------------------------


def flipped_bits(before: torch.Tensor, after: torch.Tensor, width: int) -> list[tuple[int, int]]:
    """(flat index, bit position) of every differing bit."""
    diff = (before ^ after).reshape(-1)
    out = []
    for i in torch.nonzero(diff).reshape(-1).tolist():
        bits = int(diff[i]) & ((1 << width) - 1)
        out += [(i, b) for b in range(width) if bits >> b & 1]
    return out


BIT_CASES = [
    (torch.float32, 27, "exponent"),
    (torch.float16, 3, "mantissa"),
    (torch.bfloat16, 15, "sign"),
    (torch.float64, 60, "exponent"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bit", ["sign", "exponent", "mantissa", "named"])
def test_bitflip_weights_flips_exactly_one_bit_in_count_elements(
    dtype: torch.dtype, bit: str
) -> None:
    model = make_model().to(dtype)
    layout = LAYOUTS[dtype]
    asked: int | str = next(b for d, b, _ in BIT_CASES if d == dtype) if bit == "named" else bit
    before = {n: raw(p) for n, p in model.named_parameters()}
    inj = injector(kind="bitflip", target="blocks.*.weight", bit=asked, count=3)
    (rec,) = inj.after_optimizer_step(ctx(model))
    assert inj.after_backward(ctx(model)) == []  # weights flip after the step only
    changed = {n for n, p in model.named_parameters() if not torch.equal(raw(p), before[n])}
    assert changed == {rec.details["param"]} and rec.target == rec.details["param"]
    name = rec.details["param"]
    param = dict(model.named_parameters())[name]
    flips = flipped_bits(before[name], raw(param), layout.width)
    assert len(flips) == 3 and len({i for i, _ in flips}) == 3
    positions = {b for _, b in flips}
    assert positions == {rec.details["bit"]}
    if bit == "named":
        assert rec.details["bit"] == asked
        assert rec.details["bit_class"] == next(c for d, _, c in BIT_CASES if d == dtype)
    else:
        assert rec.details["bit"] in layout.positions(bit)  # type: ignore[arg-type]
        assert rec.details["bit_class"] == bit
    assert sorted(i for i, _ in flips) == rec.details["indices"]
    values = param.detach().reshape(-1)[rec.details["indices"]].tolist()
    assert str(values) == str(rec.details["after"])  # str: NaN != NaN
    assert rec.details["dtype"] == str(dtype).removeprefix("torch.")


def test_bitflip_top_exponent_bit_turns_weights_huge_or_infinite() -> None:
    model = make_model()
    with torch.no_grad():
        model.head.bias.fill_(1.0)
    (rec,) = injector(kind="bitflip", target="head.bias", bit=30, count=4).after_optimizer_step(
        ctx(model)
    )
    assert rec.details["after"] == [math.inf] * 4  # exponent 127 -> 255, mantissa 0
    assert int(torch.isinf(model.head.bias).sum()) == 4
    (rec,) = injector(kind="bitflip", target="head.weight", bit=30, count=5).after_optimizer_step(
        ctx(model)
    )
    # |w| < 2 has the top exponent bit clear: setting it multiplies by 2**128.
    assert all(abs(a) > 1e30 for a in rec.details["after"])
    half = make_model().half()
    with torch.no_grad():
        half.head.bias.fill_(1.0)
    injector(kind="bitflip", target="head.bias", bit=14).after_optimizer_step(ctx(half))
    assert int(torch.isinf(half.head.bias).sum()) == 1


def test_bitflip_gradients(model: TinyLM) -> None:
    backward(model)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    clean = grads(model)
    inj = injector(kind="bitflip", target="blocks.1.*", tensor="gradients", bit="sign", count=2)
    assert inj.after_optimizer_step(ctx(model)) == []
    (rec,) = inj.after_backward(ctx(model))
    changed = [n for n, g in grads(model).items() if not torch.equal(g, clean[n])]
    assert changed == [rec.details["param"]] and changed[0].startswith("blocks.1.")
    g = grads(model)[changed[0]].reshape(-1)
    idx = rec.details["indices"]
    assert torch.equal(g[idx], -clean[changed[0]].reshape(-1)[idx])
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())


def test_bitflip_optimizer_state(stepped: tuple[TinyLM, torch.optim.AdamW]) -> None:
    model, opt = stepped
    state = {n: raw(opt.state[p]["exp_avg"]) for n, p in model.named_parameters()}
    sq = {n: raw(opt.state[p]["exp_avg_sq"]) for n, p in model.named_parameters()}
    inj = injector(kind="bitflip", target="head.weight", tensor="optimizer_state", bit=5)
    (rec,) = inj.after_optimizer_step(ctx(model, opt))
    assert rec.details["state_key"] == "exp_avg" and rec.details["param"] == "head.weight"
    p = model.head.weight
    assert flipped_bits(state["head.weight"], raw(opt.state[p]["exp_avg"]), 32) == [
        (rec.details["indices"][0], 5)
    ]
    for name, q in model.named_parameters():
        assert torch.equal(raw(opt.state[q]["exp_avg_sq"]), sq[name])
        if name != "head.weight":
            assert torch.equal(raw(opt.state[q]["exp_avg"]), state[name])


def test_bitflip_optimizer_state_errors(model: TinyLM) -> None:
    opt = torch.optim.AdamW(model.parameters())
    inj = injector(kind="bitflip", tensor="optimizer_state")
    with pytest.raises(InjectionError, match="needs the optimizer"):
        inj.after_optimizer_step(ctx(model))
    with pytest.raises(InjectionError, match=r"'exp_avg'.*first optimizer step"):
        inj.after_optimizer_step(ctx(model, opt))  # no step yet: no state
    backward(model)
    opt.step()
    bad_key = injector(kind="bitflip", tensor="optimizer_state", state_key="momentum_buffer")
    with pytest.raises(InjectionError, match="keys present: exp_avg, exp_avg_sq, step"):
        bad_key.after_optimizer_step(ctx(model, opt))


def test_bitflip_bit_out_of_range_for_dtype_names_it() -> None:
    model = make_model().half()
    with pytest.raises(InjectionError, match=r"bit 20 is out of range for torch\.float16"):
        injector(kind="bitflip", target="head.*", bit=20).after_optimizer_step(ctx(model))
    with pytest.raises(InjectionError, match="count=100000"):
        injector(kind="bitflip", target="head.*", count=100000).after_optimizer_step(ctx(model))
    injector(kind="bitflip", target="head.*", bit=31).after_optimizer_step(ctx(make_model()))


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(list(LAYOUTS)),
    bit=st.integers(0, 63),
    seed=st.integers(0, 2**31),
)
def test_bitflip_twice_is_identity(dtype: torch.dtype, bit: int, seed: int) -> None:
    bit %= LAYOUTS[dtype].width
    model = nn.Linear(4, 3).to(dtype)
    before = raw(model.weight)
    inj = injector(kind="bitflip", target="weight", bit=bit, count=2, seed=seed)
    inj.after_optimizer_step(ctx(model))
    assert not torch.equal(raw(model.weight), before)
    inj.after_optimizer_step(ctx(model))  # same step, same choices
    assert torch.equal(raw(model.weight), before)


# -- activation_overflow ---------------------------------------------------------------------


def test_activation_overflow_scales_output_for_the_step_only(model: TinyLM) -> None:
    mlp = model.blocks[1].mlp
    h = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(0))
    idx = tokens((2, 5))
    clean_mlp, clean_model = mlp(h), model(idx)
    inj = injector(kind="activation_overflow", target="blocks.1.mlp", factor=1e3)
    for step in (5, 6):  # several active steps: re-registered each, never stacked
        (rec,) = inj.before_forward(ctx(model, step=step))
        inj.before_forward(ctx(model, step=step))  # a second call replaces, not stacks
        assert rec.details["modules"] == ["blocks.1.mlp"]
        torch.testing.assert_close(mlp(h), clean_mlp * 1e3)
        assert not torch.allclose(model(idx), clean_model)
        assert inj.end_step(ctx(model, step=step)) == []
        assert torch.equal(mlp(h), clean_mlp) and torch.equal(model(idx), clean_model)
        assert all(not m._forward_hooks for m in model.modules())


def test_activation_overflow_overflows_fp16() -> None:
    model = make_model().half()
    h = torch.randn(4, D, generator=torch.Generator().manual_seed(0)).half()
    clean = model.blocks[0].mlp(h)
    assert torch.isfinite(clean).all()
    inj = injector(kind="activation_overflow", target="blocks.0.mlp")  # factor 1e5
    inj.before_forward(ctx(model))
    out = model.blocks[0].mlp(h)
    assert torch.isinf(out).any()
    assert torch.equal(torch.isinf(out), clean.abs() * 1e5 > 65504)
    inj.end_step(ctx(model))


def test_activation_overflow_tuple_output_and_errors() -> None:
    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x + 1, x - 1

    class Text(nn.Module):
        def forward(self, x: torch.Tensor) -> str:
            return "not a tensor"

    root = nn.ModuleDict({"pair": Pair(), "text": Text()})
    x = torch.ones(3)
    inj = injector(kind="activation_overflow", target="pair", factor=10.0)
    inj.before_forward(ctx(root))
    a, b = root["pair"](x)
    assert torch.equal(a, torch.full((3,), 20.0)) and torch.equal(b, torch.zeros(3))
    inj.end_step(ctx(root))
    text = injector(kind="activation_overflow", target="text")
    text.before_forward(ctx(root))
    with pytest.raises(InjectionError, match="'text' is str"):
        root["text"](x)
    text.end_step(ctx(root))
    with pytest.raises(InjectionError, match=r"no module matches target 'blocks\.9'"):
        injector(kind="activation_overflow", target="blocks.9").before_forward(ctx(root))


# -- grad_spike ----------------------------------------------------------------------------


def test_grad_spike_multiplies_the_matching_gradients_only(model: TinyLM) -> None:
    backward(model)
    clean = grads(model)
    (rec,) = injector(kind="grad_spike", target="blocks.0.*", factor=50.0).after_backward(
        ctx(model)
    )
    hit = [n for n in clean if n.startswith("blocks.0.")]
    assert hit and sorted(rec.details["params"]) == sorted(hit)
    for name, g in grads(model).items():
        expected = clean[name] * 50.0 if name in hit else clean[name]
        assert torch.equal(g, expected)


def test_a_grad_spike_moves_adam_further_when_beta2_is_near_one(model: TinyLM) -> None:
    """Why the fault exists: after steady gradients, a burst makes a beta2 = 0.999 Adam step
    over twice as large as a beta2 = 0.95 one (and with no burst they are the same)."""

    def step_size(beta2: float, factor: float | None) -> float:
        torch.manual_seed(0)
        param = torch.nn.Parameter(torch.ones(64))
        opt = torch.optim.Adam([param], lr=1e-2, betas=(0.9, beta2))
        for step in range(200):  # a steady gradient, so the moments settle
            param.grad = torch.full_like(param, 0.01)
            if step == 199 and factor is not None:
                param.grad.mul_(factor)
            before = param.detach().clone()
            opt.step()
        return float((param.detach() - before).abs().mean())

    burst = {b: step_size(b, 30.0) for b in (0.999, 0.95)}
    calm = {b: step_size(b, None) for b in (0.999, 0.95)}
    assert burst[0.999] > 2 * burst[0.95]
    assert calm[0.999] == pytest.approx(calm[0.95], rel=0.05)


# -- grad_underflow ------------------------------------------------------------------------


def test_grad_underflow_scales_gradients(model: TinyLM) -> None:
    backward(model)
    clean = grads(model)
    (rec,) = injector(
        kind="grad_underflow", target="blocks.0.*", factor=1e-3, mode="scale"
    ).after_backward(ctx(model))
    for name, g in grads(model).items():
        expected = clean[name] * 1e-3 if name.startswith("blocks.0.") else clean[name]
        assert torch.equal(g, expected)
    assert rec.details["zeroed"] == 0
    half = make_model().half()
    for p in half.parameters():
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(0)).half()
    (rec,) = injector(kind="grad_underflow", factor=1e-30, mode="scale").after_backward(ctx(half))
    assert all(p.grad is not None and not p.grad.any() for p in half.parameters())
    assert rec.details["zeroed"] == sum(p.numel() for p in half.parameters())


def test_grad_underflow_flushes_what_fp16_cannot_hold_and_a_larger_scale_saves_it(
    model: TinyLM,
) -> None:
    """fp16 mode: gradients `factor` lower in fp16's range flush to zero at the usual
    initial loss scale (2^16); scaled 2^8 higher (a larger loss scale) most survive, at
    their own size."""
    backward(model)
    clean = grads(model)
    median = float(torch.cat([g.flatten().abs() for g in clean.values()]).median())
    factor = 2.0**-28 / (median * 2.0**16)  # the median element sits 2^4 under fp16's floor
    ratios = {}
    for scale in (2.0**16, 2.0**24):
        for p in model.parameters():
            assert p.grad is not None
            p.grad.copy_(clean_of(clean, p, model) * scale)
        (rec,) = injector(kind="grad_underflow", factor=factor).after_backward(ctx(model))
        kept = grads(model)
        total = sum(g.numel() for g in kept.values())
        ratios[scale] = sum(int(torch.count_nonzero(g)) for g in kept.values()) / total
        assert rec.details["mode"] == "fp16" and rec.details["zeroed"] > 0
        for name, g in kept.items():  # survivors keep their size (fp16's coarse rounding)
            alive = g != 0
            want = clean[name][alive] * scale
            assert torch.allclose(g[alive], want, rtol=1.0, atol=0)  # at worst 2x
    assert ratios[2.0**16] < 0.2 and ratios[2.0**24] > 0.8


def clean_of(clean: dict[str, torch.Tensor], param: torch.Tensor, model: TinyLM) -> torch.Tensor:
    """The clean gradient of ``param``."""
    name = next(n for n, p in model.named_parameters() if p is param)
    return clean[name]


# -- lr_spike --------------------------------------------------------------------------------


def test_lr_spike_during_the_step_and_exact_restore(model: TinyLM) -> None:
    lrs = [7e-4, 1e-3]  # 7e-4 * 50 / 50 != 7e-4: a restore by division would show
    opt = torch.optim.AdamW(
        [
            {"params": model.blocks.parameters(), "lr": lrs[0]},
            {"params": model.head.parameters(), "lr": lrs[1]},
        ],
        weight_decay=0.0,
    )
    backward(model)
    w0 = model.head.weight.detach().clone()
    inj = injector(kind="lr_spike", factor=50.0)
    (rec,) = inj.before_optimizer_step(ctx(model, opt))
    assert [g["lr"] for g in opt.param_groups] == [lr * 50.0 for lr in lrs]
    assert rec.details["lr_before"] == lrs and rec.details["lr_during"] == [lr * 50 for lr in lrs]
    opt.step()
    # Adam's first update is ~lr per element: observed at 50x the configured lr.
    step_size = (model.head.weight.detach() - w0).abs().max().item()
    assert step_size == pytest.approx(lrs[1] * 50, rel=1e-2)
    inj.after_optimizer_step(ctx(model, opt))
    assert [g["lr"] for g in opt.param_groups] == lrs  # exactly, not approximately
    inj.end_step(ctx(model, opt))
    assert [g["lr"] for g in opt.param_groups] == lrs
    # A step that never reached after_optimizer_step is restored at end_step.
    inj.before_optimizer_step(ctx(model, opt, step=6))
    inj.before_optimizer_step(ctx(model, opt, step=6))  # never compounds
    assert [g["lr"] for g in opt.param_groups] == [lr * 50.0 for lr in lrs]
    inj.end_step(ctx(model, opt, step=6))
    assert [g["lr"] for g in opt.param_groups] == lrs
    with pytest.raises(InjectionError, match="needs the optimizer"):
        inj.before_optimizer_step(ctx(model))


# -- bad_batch -------------------------------------------------------------------------------


def test_bad_batch_replaces_the_share_of_rows(model: TinyLM) -> None:
    batch = tokens((8, 13), vocab=10)  # max < VOCAB: the vocab comes from the embedding
    original = batch.clone()
    inj = injector(kind="bad_batch", fraction=0.25)
    out, (rec,) = inj.on_batch(ctx(model), batch)
    assert torch.equal(batch, original)
    assert out.shape == batch.shape and out.dtype == batch.dtype and out.device == batch.device
    rows = rec.details["rows"]
    assert len(rows) == 2 and rec.details["vocab_size"] == VOCAB
    changed = [i for i in range(8) if not torch.equal(out[i], batch[i])]
    assert changed == rows
    assert int(out.min()) >= 0 and int(out.max()) < VOCAB
    assert int(out[rows].max()) >= 10  # drawn from the model's vocab, not the batch's


def test_bad_batch_rows_are_sequences_and_vocab_fallbacks() -> None:
    batch = tokens((2, 4, 9), vocab=7).to(torch.int32)  # (accum, micro-batch, T+1)
    out, (rec,) = injector(kind="bad_batch", fraction=0.5).on_batch(ctx(None), batch)
    assert rec.details["vocab_size"] == int(batch.max()) + 1 and rec.details["of_rows"] == 8
    flat_in, flat_out = batch.reshape(8, 9), out.reshape(8, 9)
    changed = [i for i in range(8) if not torch.equal(flat_in[i], flat_out[i])]
    assert changed == rec.details["rows"] and len(changed) == 4 and out.dtype == torch.int32
    assert int(out.max()) < rec.details["vocab_size"]
    out, (rec,) = injector(kind="bad_batch", vocab_size=3).on_batch(ctx(make_model()), batch)
    assert rec.details["vocab_size"] == 3 and len(rec.details["rows"]) == 8
    assert int(out.max()) < 3
    with pytest.raises(InjectionError, match="token ids"):
        injector(kind="bad_batch").on_batch(ctx(None), torch.ones(2, 3))


# -- determinism and the global RNGs ---------------------------------------------------------

FIELDS: dict[str, dict[str, Any]] = {
    "nan_grad": {"fraction": 0.3},
    "inf_grad": {"fraction": 0.3},
    # One target and a fixed bit: only the element choice is left to vary.
    "bitflip": {"tensor": "optimizer_state", "target": "head.weight", "count": 4, "bit": 3},
    "activation_overflow": {"target": "blocks.*.mlp"},
    "grad_underflow": {},
    "grad_spike": {},
    "lr_spike": {},
    "bad_batch": {"fraction": 0.5},
}


def stepped_context(step: int = 5, rank: int = 0) -> StepContext:
    """A fresh model after one AdamW step, with gradients from a second backward."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    backward(model)
    opt.step()
    backward(model)
    return ctx(model, opt, step=step, rank=rank)


def run_step(kind: str, c: StepContext, seed: int = 7) -> list[Injection]:
    """Every hook of one kind in step order, with a forward pass; returns its records."""
    assert c.model is not None
    inj = injector(kind=kind, seed=seed, **FIELDS[kind])
    records = inj.on_batch(c, tokens((16, 9)))[1]
    records += inj.before_forward(c)
    c.model(tokens((2, 5)))
    records += inj.after_backward(c)
    if kind == "nan_grad":  # the poisoned elements themselves, not just their count
        mask = [
            p.grad.isnan().nonzero().tolist() for p in c.model.parameters() if p.grad is not None
        ]
        records.append(Injection(kind, "mask", {"mask": mask}))
    records += inj.before_optimizer_step(c)
    records += inj.after_optimizer_step(c)
    records += inj.end_step(c)
    return records


@pytest.mark.parametrize("kind", ["nan_grad", "bitflip", "bad_batch"])
def test_choices_depend_only_on_seed_step_and_rank(kind: str) -> None:
    first = run_step(kind, stepped_context(step=5))
    assert run_step(kind, stepped_context(step=5)) == first
    assert run_step(kind, stepped_context(step=6)) != first
    assert run_step(kind, stepped_context(step=5, rank=1)) != first
    assert run_step(kind, stepped_context(step=5), seed=8) != first


def global_rngs() -> tuple[Any, ...]:
    """The global torch, numpy and python RNG states, comparable with ==."""
    np_state = np.random.get_state()
    return (
        torch.random.get_rng_state().tolist(),
        np_state[0],
        np_state[1].tolist(),
        *np_state[2:],
        random.getstate(),
    )


@pytest.mark.parametrize("kind", NUMERIC + LOSS_SPIKE)
def test_injectors_leave_global_rngs_untouched(kind: str) -> None:
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    c = stepped_context()
    before = global_rngs()
    records = run_step(kind, c)
    assert records, f"{kind} did nothing"
    assert global_rngs() == before


# -- specs and the registry ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "field"),
    [
        ({"kind": "nan_grad", "fraction": 0}, "fraction"),
        ({"kind": "inf_grad", "fraction": 1.5}, "fraction"),
        ({"kind": "grad_underflow", "factor": -1e-3}, "factor"),
        ({"kind": "grad_underflow", "factor": 2.0}, "factor"),
        ({"kind": "grad_spike", "factor": 1.0}, "factor"),
        ({"kind": "grad_spike", "factor": float("nan")}, "factor"),
        ({"kind": "lr_spike", "factor": 0.5}, "factor"),
        ({"kind": "activation_overflow"}, "target"),
        ({"kind": "activation_overflow", "target": "x", "factor": float("inf")}, "factor"),
        ({"kind": "bad_batch", "vocab_size": 0}, "vocab_size"),
        ({"kind": "bitflip", "bit": 64}, "bit"),
        ({"kind": "bitflip", "bit": "payload"}, "bit"),
        ({"kind": "bitflip", "tensor": "buffers"}, "tensor"),
        ({"kind": "bitflip", "count": 0}, "count"),
        ({"kind": "nan_grad", "targte": "x"}, "targte"),
    ],
)
def test_bad_specs_name_the_field(fault: dict[str, Any], field: str) -> None:
    with pytest.raises(FaultSpecError, match=rf"plan\.faults\[0\]\.{field}"):
        parse_fault({"at_step": 3, **fault}, "plan.faults[0]")


def test_specs_parse_with_defaults() -> None:
    spec = parse_fault({"kind": "bitflip", "every": 10, "bit": 7}, "plan.faults[0]")
    assert isinstance(spec, BitflipSpec) and spec.bit == 7 and spec.tensor == "weights"
    assert parse_fault({"kind": "bitflip", "at_step": 1}).bit == "exponent"  # type: ignore[attr-defined]
    assert parse_fault({"kind": "lr_spike", "at_step": 1}).factor == 100.0  # type: ignore[attr-defined]


def test_every_numeric_and_loss_spike_kind_is_registered_with_a_description() -> None:
    table = kinds()
    for kind in NUMERIC + LOSS_SPIKE:
        spec = table[kind].spec
        assert spec.description
        assert spec.fault_class == ("loss_spike" if kind in LOSS_SPIKE else "numeric")
        schema = spec.model_json_schema()
        assert all("description" in p for n, p in schema["properties"].items() if n != "kind")


def test_lr_spike_restores_a_tensor_lr_untouched(model: TinyLM) -> None:
    lr = torch.tensor(1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)
    original = opt.param_groups[0]["lr"]
    inj = injector(kind="lr_spike", factor=4.0)
    inj.before_optimizer_step(ctx(model, opt))
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(4e-3)
    inj.after_optimizer_step(ctx(model, opt))
    assert opt.param_groups[0]["lr"] is original and float(original) == pytest.approx(1e-3)
