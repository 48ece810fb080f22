"""Hard-sample weighting in a real (tiny) run: the weights spread within bounds, the run
differs from one without it, and a resume is bit-exact (the recent loss it judges by is in
the checkpoint; the negative control drops it and the resumed steps differ)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from harness.records.journal import read_journal
from reference_trainer.checkpoints import files as ckpt
from reference_trainer.checkpoints.manifest import describe_tensors, write_manifest
from reference_trainer.config import TrainConfig
from tests.test_trainer import assert_same_tensors, final_state, run, tiny

pytestmark = pytest.mark.slow

STEPS, SPLIT = 8, 4


def _config(*, weighted: bool) -> TrainConfig:
    cfg = tiny(steps=STEPS, checkpoint_every=SPLIT)
    h = cfg.stability.hard_samples
    # A steeper rule than the default, so that 8 steps show the weights spread.
    h.enabled, h.power, h.ema = weighted, 4.0, 0.5
    return TrainConfig.from_dict(cfg.to_dict())  # validated like a config.json


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("hard") / "straight"
    run(_config(weighted=True), run_dir)
    return run_dir


def test_weights_spread_within_bounds_and_change_what_the_run_learns(
    straight: Path, tmp_path: Path
) -> None:
    run(_config(weighted=False), tmp_path / "without")
    without, with_ = read_journal(tmp_path / "without"), read_journal(straight)
    assert all("sample_weight_max" not in e.fields for e in without.of_kind("step"))
    largest = {e.step: e["sample_weight_max"] for e in with_.of_kind("step")}
    assert largest[1] == 1.0  # no recent loss yet: uniform
    cfg = _config(weighted=True).stability.hard_samples
    assert all(1.0 <= w <= cfg.max_factor + 1e-9 for w in largest.values())
    assert max(largest.values()) > 1.05, largest
    # The same first step (the reported loss is the unweighted mean), then other updates.
    assert with_.losses()[0] == without.losses()[0]
    assert all(a != b for a, b in zip(with_.losses()[2:], without.losses()[2:], strict=True))


def test_resume_with_hard_sample_weighting_is_bit_exact(straight: Path, tmp_path: Path) -> None:
    cfg = _config(weighted=True)
    split = tmp_path / "split"
    run(cfg, split, stop_after=SPLIT)
    run(cfg, split, resume=True)
    assert read_journal(split).losses() == read_journal(straight).losses()  # exact
    a, b = final_state(straight), final_state(split)
    baseline = a["trainer"]["hard_samples"]["baseline"]
    assert isinstance(baseline, float) and math.isfinite(baseline)
    assert a["trainer"]["hard_samples"] == b["trainer"]["hard_samples"]
    assert_same_tensors(a["model"], b["model"], "model")


def test_a_resume_that_loses_the_recent_loss_is_caught(straight: Path, tmp_path: Path) -> None:
    """Negative control for the test above: drop the saved recent loss (the resumed run
    weighs its first step uniformly) and the resumed steps train differently."""
    cfg = _config(weighted=True)
    split = tmp_path / "split"
    run(cfg, split, stop_after=SPLIT)
    latest = ckpt.latest_checkpoint(split)
    assert latest is not None
    state = final_state(split)
    state["trainer"]["hard_samples"] = {}
    torch.save(state, latest / "state.pt")
    (latest / "manifest.json").unlink()  # re-sign the edited checkpoint so it loads
    run_id = ckpt.read_run_id(split)
    tensors = describe_tensors(state)
    write_manifest(latest, run_id=run_id, step=SPLIT, kind="full", parent=None, tensors=tensors)
    run(cfg, split, resume=True)
    losses, expected = read_journal(split).losses(), read_journal(straight).losses()
    assert losses[: SPLIT + 1] == expected[: SPLIT + 1]
    assert losses[SPLIT + 1 :] != expected[SPLIT + 1 :]
