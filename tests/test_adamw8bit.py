"""8-bit AdamW (``--optimizer adamw8bit``): quantized moments where they pay, 32-bit state for
the stable token embedding, the same parameter groups as AdamW, a halved clipping threshold,
state that survives a checkpoint exactly, and bit flips that hit the stored 8-bit codes."""

from __future__ import annotations

import copy
import io
import math
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from faults import InjectionError, StepContext, build_injector, parse_fault
from reference_trainer.config import OptimConfig, TrainConfig, preset
from reference_trainer.errors import ConfigError
from reference_trainer.model.gpt import GPT, GPTConfig, next_token_loss
from reference_trainer.model.optim import build_optimizer
from reference_trainer.model.stable_embedding import StableEmbedding
from reference_trainer.stability.clipping import ClipConfig, clip_threshold

VOCAB, EMBD = 256, 64


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Small tensors gain nothing from threads; on a busy machine they cost seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def model(stable: bool | None = True, seed: int = 0) -> GPT:
    """A one-block GPT whose matrices are big enough (>= 4096 elements) for 8-bit state."""
    torch.manual_seed(seed)
    shape = GPTConfig(
        vocab_size=VOCAB, block_size=16, n_layer=1, n_head=2, n_embd=EMBD, stable_embedding=stable
    )
    return GPT(shape)


def train_steps(net: GPT, opt: torch.optim.Optimizer, steps: int, seed: int = 1) -> None:
    """``steps`` optimizer steps on seeded random tokens at a fixed learning rate."""
    gen = torch.Generator().manual_seed(seed)
    for group in opt.param_groups:
        group["lr"] = 1e-3
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (4, 17), generator=gen)
        next_token_loss(net(tokens[:, :-1]), tokens[:, 1:]).backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)


def adamw8bit(net: GPT) -> torch.optim.Optimizer:
    return build_optimizer(net, OptimConfig(name="adamw8bit"))


def state_of(opt: torch.optim.Optimizer, net: GPT, name: str) -> dict[str, Any]:
    return opt.state[dict(net.named_parameters())[name]]


def test_matrices_get_8bit_state_and_the_stable_embedding_32bit() -> None:
    net = model(stable=True)
    opt = adamw8bit(net)
    train_steps(net, opt, 1)
    qkv = state_of(opt, net, "blocks.0.attn.qkv.weight")
    assert qkv["state1"].dtype == qkv["state2"].dtype == torch.uint8
    assert qkv["state1"].shape == net.blocks[0].attn.qkv.weight.shape  # type: ignore[union-attr]
    wte = state_of(opt, net, "wte.weight")  # also the tied head's weight
    assert wte["state1"].dtype == torch.float32 and "absmax1" not in wte
    assert state_of(opt, net, "blocks.0.attn.qkv.bias")["state1"].dtype == torch.float32


def test_without_the_stable_embedding_its_state_is_8bit_too() -> None:
    """Negative control: the 32-bit embedding state above comes from the stable embedding."""
    net = model(stable=False)
    opt = adamw8bit(net)
    train_steps(net, opt, 1)
    assert state_of(opt, net, "wte.weight")["state1"].dtype == torch.uint8


def test_the_groups_are_adamws_layered_epsilon_and_weight_decay() -> None:
    net = model()
    plain = build_optimizer(net, OptimConfig(name="adamw")).param_groups
    eight = adamw8bit(net).param_groups
    keys = ("name", "param_names", "eps", "weight_decay", "betas")
    assert [{k: g[k] for k in keys} for g in eight] == [{k: g[k] for k in keys} for g in plain]
    assert {g["name"]: g["eps"] for g in eight}["embedding.no_decay"] == 1e-6


def test_its_steps_follow_adamws() -> None:
    """Quantized moments approximate AdamW's: the same model moves the same way."""
    start = model()
    a, b = copy.deepcopy(start), copy.deepcopy(start)
    train_steps(a, build_optimizer(a, OptimConfig(name="adamw")), 5)
    train_steps(b, adamw8bit(b), 5)
    w0 = dict(start.named_parameters())
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        da, db = (pa - w0[name]).flatten(), (pb - w0[name]).flatten()
        assert float(db.norm()) > 0, name
        cosine = float(da @ db / (da.norm() * db.norm()))
        assert cosine > 0.9, f"{name}: cosine {cosine:.3f} with AdamW's update"


def test_the_stable_embedding_is_the_default_for_adamw8bit_only() -> None:
    cfg = preset("tiny")
    assert cfg.model_config().stable_embedding is False
    assert "wte.norm.weight" not in GPT(cfg.model_config()).state_dict()
    data = cfg.to_dict()
    data["optim"]["name"] = "adamw8bit"
    assert TrainConfig.from_dict(data).model_config().stable_embedding is True
    data["model"]["stable_embedding"] = False  # the user's word wins
    assert TrainConfig.from_dict(data).model_config().stable_embedding is False
    data["model"]["stable_embedding"] = "yes"
    with pytest.raises(ConfigError, match=r"model\.stable_embedding must be true, false or null"):
        TrainConfig.from_dict(data)


def test_an_adamw_model_is_the_model_built_before_the_switch() -> None:
    """The switch off builds exactly the old model: same modules, same initial weights."""
    torch.manual_seed(0)
    old = GPT(GPTConfig(vocab_size=VOCAB, block_size=16, n_layer=1, n_head=2, n_embd=EMBD))
    new = model(stable=False)
    assert type(new.wte) is torch.nn.Embedding
    assert all(torch.equal(p, q) for p, q in zip(old.parameters(), new.parameters(), strict=True))


def test_the_stable_embedding_normalizes_rows_and_keeps_its_xavier_init() -> None:
    net = model(stable=True)
    assert isinstance(net.wte, StableEmbedding) and net.lm_head.weight is net.wte.weight
    bound = math.sqrt(6 / (VOCAB + EMBD))
    w = net.wte.weight.detach()
    assert float(w.abs().max()) <= bound
    assert float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.05)  # not GPT's 0.02
    rows = net.wte(torch.arange(VOCAB).view(1, -1)).detach()
    assert torch.allclose(rows.mean(-1), torch.zeros(1, VOCAB), atol=1e-5)
    assert torch.allclose(rows.var(-1, unbiased=False), torch.ones(1, VOCAB), atol=1e-2)


@pytest.mark.slow
def test_adamw_runs_never_import_bitsandbytes() -> None:
    code = (
        "import sys; from reference_trainer.model.optim import build_optimizer; "
        "from reference_trainer.model.gpt import GPT, GPTConfig; "
        "from reference_trainer.config import OptimConfig; "
        "build_optimizer(GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, "
        "n_embd=4)), OptimConfig()); print('bitsandbytes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_clipping_threshold_is_halved_for_adamw8bit() -> None:
    clip = ClipConfig()
    assert clip.threshold(16, "adamw") == clip_threshold(1.0, 16)
    assert clip.threshold(16, "adamw8bit") == 0.5 * clip.threshold(16, "adamw")
    assert ClipConfig(optimizer_factors={}).threshold(16, "adamw8bit") == clip_threshold(1.0, 16)
    with pytest.raises(ConfigError, match="optimizer_factors has unknown optimizer 'lion'"):
        ClipConfig(optimizer_factors={"lion": 0.5})
    with pytest.raises(ConfigError, match=r"optimizer_factors.adamw8bit must be in \(0, 1\]"):
        ClipConfig(optimizer_factors={"adamw8bit": 0.0})


def test_the_state_survives_a_weights_only_checkpoint_exactly() -> None:
    net = model()
    opt = adamw8bit(net)
    train_steps(net, opt, 3)
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    again = model(seed=5)  # other weights, replaced by the checkpoint's
    again.load_state_dict(saved["model"])
    reopt = adamw8bit(again)
    reopt.load_state_dict(saved["optimizer"])
    train_steps(net, opt, 2, seed=9)
    train_steps(again, reopt, 2, seed=9)
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), again.parameters(), strict=True))
    for p, q in zip(net.parameters(), again.parameters(), strict=True):
        for key, value in opt.state[p].items():
            other = reopt.state[q][key]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other


def flip(opt: torch.optim.Optimizer, net: GPT, **spec: Any) -> Any:
    injector = build_injector(
        parse_fault({"kind": "bitflip", "at_step": 5, "tensor": "optimizer_state"} | spec)
    )
    ctx = StepContext(step=5, rank=0, world_size=1, model=net, optimizer=opt)
    (record,) = injector.after_optimizer_step(ctx)
    return record


def test_a_bitflip_on_8bit_state_flips_one_stored_code() -> None:
    net = model()
    opt = adamw8bit(net)
    train_steps(net, opt, 2)
    twin = copy.deepcopy(net)
    twin_opt = adamw8bit(twin)
    twin_opt.load_state_dict(opt.state_dict())
    target = "blocks.0.mlp.fc.weight"
    before = {n: {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)}
              for n, p in net.named_parameters()}  # fmt: skip
    record = flip(opt, net, target=target, state_key="state1", bit=7)
    assert record.details["dtype"] == "uint8" and record.details["bit_class"] == "code"
    (i,) = record.details["indices"]
    state = state_of(opt, net, target)
    old, new = before[target]["state1"].flatten(), state["state1"].flatten()
    assert torch.nonzero(old != new).flatten().tolist() == [i]
    assert int(old[i]) ^ int(new[i]) == 128 and record.details["after"] == [int(new[i])]
    for name, p in net.named_parameters():  # nothing else of the state moved
        for key, value in before[name].items():
            if (name, key) != (target, "state1"):
                assert torch.equal(opt.state[p][key], value), (name, key)
    # The optimizer reads the flipped code: the next update of that matrix differs, no other.
    train_steps(net, opt, 1, seed=3)
    train_steps(twin, twin_opt, 1, seed=3)
    differ = [n for (n, p), q in zip(net.named_parameters(), twin.parameters(), strict=True)
              if not torch.equal(p, q)]  # fmt: skip
    assert differ == [target]


def test_a_bitflip_naming_fp32_state_on_8bit_state_lists_what_exists() -> None:
    net = model()
    opt = adamw8bit(net)
    train_steps(net, opt, 1)
    with pytest.raises(InjectionError) as caught:
        flip(opt, net, target="blocks.0.mlp.fc.weight")  # state_key: exp_avg, the default
    message = str(caught.value)
    assert "'exp_avg'" in message and "keys present: absmax1, absmax2, qmap1" in message
    assert "8-bit codes (flip with bit: 0-7): state1, state2" in message
    with pytest.raises(InjectionError, match="8-bit codes with no sign, exponent or mantissa"):
        flip(opt, net, target="blocks.0.mlp.fc.weight", state_key="state1")  # bit: exponent
