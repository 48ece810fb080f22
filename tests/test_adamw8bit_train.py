"""The reference trainer with 8-bit AdamW: a stopped run resumes bit-exactly, and the smoke
suite's NaN-gradient and learning-rate-spike scenarios pass, judged by the harness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.records.journal import read_journal
from harness.running.runner import RunOptions, run_suite
from harness.suites.suite_loader import parse_suite
from reference_trainer.checkpoints import files as ckpt
from reference_trainer.stability import clipping_step

from .test_trainer import assert_same_tensors, final_state, run, tiny

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_an_adamw8bit_run_resumes_bit_exactly(tmp_path: Path) -> None:
    cfg = tiny(steps=16, checkpoint_every=8)
    cfg.optim.name = "adamw8bit"
    run(cfg, tmp_path / "straight")
    run(cfg, tmp_path / "split", stop_after=8)
    assert ckpt.checkpoint_step(ckpt.latest_checkpoint(tmp_path / "split")) == 8  # type: ignore[arg-type]
    run(cfg, tmp_path / "split", resume=True)
    straight, split = read_journal(tmp_path / "straight"), read_journal(tmp_path / "split")
    assert len(straight.losses()) == 16 and straight.losses() == split.losses()
    a, b = final_state(tmp_path / "straight"), final_state(tmp_path / "split")
    assert "wte.norm.weight" in a["model"]  # the stable embedding was on
    quantized = [
        s for s in a["optimizer"]["state"].values() if "__bnb_optimizer_quant_state__" in s
    ]
    assert quantized  # 8-bit state really went through the checkpoint
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"], b["optimizer"], "optimizer")


def test_the_trainer_clips_adamw8bit_at_half_of_adamws_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thresholds: dict[str, list[float]] = {}
    real = clipping_step.clip_gradients

    def spy(layers: Any, threshold: float, factors: Any) -> tuple[float, float]:
        thresholds[current].append(threshold)
        return real(layers, threshold, factors)

    monkeypatch.setattr(clipping_step, "clip_gradients", spy)
    for current in ("adamw", "adamw8bit"):
        thresholds[current] = []
        cfg = tiny(steps=2, checkpoint_every=2)
        cfg.optim.name = current
        run(cfg, tmp_path / current)
    assert len(thresholds["adamw"]) == len(thresholds["adamw8bit"]) == 2
    assert thresholds["adamw8bit"] == [0.5 * t for t in thresholds["adamw"]]


def test_the_smoke_suites_numeric_and_spike_scenarios_pass_with_adamw8bit(
    tmp_path: Path,
) -> None:
    data = yaml.safe_load((ROOT / "scenarios" / "smoke.yaml").read_text())
    # 30 steps instead of 40: the faults at step 15 and the checkpoint at 10 are the same.
    data["defaults"]["trainer"] |= {"optimizer": "adamw8bit", "steps": 30}
    data["scenarios"] = [s for s in data["scenarios"] if s["name"] in ("nan-grad", "lr-spike")]
    suite = parse_suite(data, "smoke.yaml with adamw8bit")
    options = RunOptions(out_dir=tmp_path / "out", cache_dir=tmp_path / "cache", cores=2)
    result = run_suite(suite, options, progress=False)
    assert [(r.name, r.status) for r in result.scenarios] == [
        ("nan-grad", "passed"),
        ("lr-spike", "passed"),
    ]
    config = (tmp_path / "out" / "runs" / "nan-grad" / "config.json").read_text()
    assert '"name": "adamw8bit"' in config
