"""The reference trainer with Sophia, run for real: bit-exact resume across Hessian
estimates, bit flips in its state, and the smoke suite's numeric and loss-spike scenarios
judged by the harness."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from faults import FaultPlan
from harness.records.journal import read_journal
from harness.running.runner import RunOptions, run_suite
from harness.suites.suite_loader import parse_suite
from reference_trainer.checkpoints import files as ckpt
from reference_trainer.config import TrainConfig
from tests.test_trainer import assert_same_tensors, final_state, run, tiny

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def sophia(**overrides: object) -> TrainConfig:
    """The tiny preset trained with Sophia, a Hessian estimate every 5 steps."""
    data = tiny(**overrides).to_dict()
    data["optim"] |= {"name": "sophia", "sophia": {"hessian_every": 5}}
    return TrainConfig.from_dict(data)


def test_resume_across_hessian_estimates_is_bit_exact(tmp_path: Path) -> None:
    # Estimates after steps 1, 6, 11 (before the stop at 12), 16 and 21 (after the resume).
    cfg = sophia(steps=24, checkpoint_every=12)
    run(cfg, tmp_path / "straight")
    run(cfg, tmp_path / "split", stop_after=12)
    assert ckpt.checkpoint_step(ckpt.latest_checkpoint(tmp_path / "split")) == 12  # type: ignore[arg-type]
    run(cfg, tmp_path / "split", resume=True)
    straight, split = read_journal(tmp_path / "straight"), read_journal(tmp_path / "split")
    assert len(straight.losses()) == 24 and straight.losses() == split.losses()
    a, b = final_state(tmp_path / "straight"), final_state(tmp_path / "split")
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"], b["optimizer"], "optimizer")
    state = a["optimizer"]["state"][0]
    assert set(state) == {"step", "exp_avg", "hessian"} and float(state["step"]) == 24
    assert float(state["hessian"].abs().sum()) > 0  # the estimates reached the state


def test_bitflips_land_in_sophia_s_momentum_and_hessian(tmp_path: Path) -> None:
    flip = {"kind": "bitflip", "tensor": "optimizer_state", "target": "blocks.0.mlp.fc.weight"}
    plan = FaultPlan.from_dict(
        [
            {**flip, "at_step": 8, "bit": 30, "count": 4},  # the default entry: exp_avg
            {**flip, "at_step": 14, "bit": 30, "count": 4, "state_key": "hessian"},
        ]
    )
    run(sophia(steps=20, checkpoint_every=10), tmp_path, plan=plan)
    journal = read_journal(tmp_path)
    injected = journal.of_kind("fault_injected")
    assert [(e.step, e["details"]["state_key"]) for e in injected] == [
        (8, "exp_avg"),
        (14, "hessian"),
    ]
    for event in injected:
        before, after = event["details"]["before"], event["details"]["after"]
        # The top exponent bit of small float32 values: each stored value grew by 2^128.
        assert all(
            b != 0 and a / b == pytest.approx(2.0**128) for b, a in zip(before, after, strict=True)
        )
    steps = journal.of_kind("step")
    assert len(steps) == 20 and journal.of_kind("run_end")[-1]["status"] == "completed"
    # Sophia's clipped update bounds the step a huge momentum can take: no NaN, no blow-up.
    assert all(e.get("params_finite", True) for e in steps)
    assert all(math.isfinite(e["loss"]) for e in steps)


def test_the_smoke_suite_s_nan_grad_and_lr_spike_pass_with_sophia(tmp_path: Path) -> None:
    smoke = yaml.safe_load((ROOT / "scenarios" / "smoke.yaml").read_text())
    smoke["defaults"]["trainer"]["optimizer"] = "sophia"
    smoke["scenarios"] = [s for s in smoke["scenarios"] if s["name"] in ("nan-grad", "lr-spike")]
    suite = parse_suite(smoke, "smoke.yaml with sophia")
    options = RunOptions(out_dir=tmp_path, cache_dir=tmp_path / "cache", cores=2)
    result = run_suite(suite, options, progress=False)
    assert [r.name for r in result.scenarios] == ["nan-grad", "lr-spike"]
    for name in ("nan-grad", "lr-spike"):  # the runs the verdicts judge trained with Sophia
        config = TrainConfig.load(tmp_path / "runs" / name)
        assert config.optim.name == "sophia"
    for scenario in result.scenarios:
        checks = [(c.name, c.figure, c.detail) for c in scenario.checks]
        assert scenario.status == "passed", (scenario.name, checks)
