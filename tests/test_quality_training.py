"""Quality-weighted sampling in a real (tiny) run on the llama mix: the weights move within
bounds, the run differs from one without it, and a resume is bit-exact."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from harness.records.journal import read_journal
from reference_trainer.checkpoints import files as ckpt
from reference_trainer.checkpoints.manifest import describe_tensors, write_manifest
from reference_trainer.config import TrainConfig
from reference_trainer.corpus.corpus import SOURCE_NAMES
from reference_trainer.corpus.mixes import mix_weights
from tests.test_trainer import assert_same_tensors, final_state, run, tiny

pytestmark = pytest.mark.slow

STEPS, SPLIT = 24, 12
LLAMA = mix_weights("llama")


def _config(*, quality: bool) -> TrainConfig:
    cfg = tiny(steps=STEPS, checkpoint_every=SPLIT)
    cfg.data.source_weights = dict(LLAMA)
    q = cfg.stability.quality_sampling
    # Faster than the defaults, so that 24 steps show the weights move.
    q.enabled, q.ema, q.power, q.min_tokens, q.journal_every = quality, 0.3, 4.0, 16, 1
    return TrainConfig.from_dict(cfg.to_dict())  # validated like a config.json


def _weights(run_dir: Path) -> dict[int, dict[str, object]]:
    return {e.step: e.fields for e in read_journal(run_dir).of_kind("data_weights")}


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("quality") / "straight"
    run(_config(quality=True), run_dir)
    return run_dir


def test_weights_move_within_bounds_and_change_what_the_run_trains_on(
    straight: Path, tmp_path: Path
) -> None:
    run(_config(quality=False), tmp_path / "without")
    without, with_ = read_journal(tmp_path / "without"), read_journal(straight)
    assert not list(without.of_kind("data_weights"))
    events = _weights(straight)
    assert sorted(events) == list(range(1, STEPS + 1))
    q = _config(quality=True).stability.quality_sampling
    for fields in events.values():
        weights = fields["weights"]
        assert isinstance(weights, dict) and set(weights) == set(LLAMA)
        assert math.isclose(sum(weights.values()), 1.0)
        for source, base in LLAMA.items():
            assert q.min_factor * base - 1e-9 <= weights[source] <= q.max_factor * base + 1e-9
    last = events[STEPS]
    weights, quality = last["weights"], last["quality"]
    assert isinstance(weights, dict) and isinstance(quality, dict)
    moved = {s: weights[s] / LLAMA[s] for s in LLAMA}
    assert max(abs(m - 1) for m in moved.values()) > 0.05, moved
    # The documented direction: the source scored worst is the one held furthest down.
    assert min(moved, key=moved.__getitem__) == min(quality, key=quality.__getitem__)
    # Same start (the first documents were read before any step), then other documents.
    assert with_.losses()[0] == without.losses()[0]
    assert with_.losses()[SPLIT:] != without.losses()[SPLIT:]


def test_resume_with_quality_sampling_is_bit_exact(straight: Path, tmp_path: Path) -> None:
    cfg = _config(quality=True)
    split = tmp_path / "split"
    run(cfg, split, stop_after=SPLIT)
    run(cfg, split, resume=True)
    assert read_journal(split).losses() == read_journal(straight).losses()  # exact
    assert _weights(split) == _weights(straight)
    a, b = final_state(straight), final_state(split)
    base = [LLAMA.get(s, 0.0) for s in SOURCE_NAMES]
    assert a["trainer"]["quality"]["weights"] != base  # they moved, and were saved
    assert_same_tensors(a["trainer"]["quality"], b["trainer"]["quality"], "quality")
    assert_same_tensors(a["data"], b["data"], "data")
    assert_same_tensors(a["model"], b["model"], "model")


def test_a_resume_that_loses_the_weights_is_caught(straight: Path, tmp_path: Path) -> None:
    """Negative control for the test above: drop the saved scores and weights (the run
    resumes at the base weights) and the resumed steps train on other documents."""
    cfg = _config(quality=True)
    split = tmp_path / "split"
    run(cfg, split, stop_after=SPLIT)
    latest = ckpt.latest_checkpoint(split)
    assert latest is not None
    state = final_state(split)
    state["trainer"]["quality"] = {}
    torch.save(state, latest / "state.pt")
    (latest / "manifest.json").unlink()  # re-sign the edited checkpoint so it loads
    tensors = describe_tensors(state)
    run_id = ckpt.read_run_id(split)
    write_manifest(latest, run_id=run_id, step=SPLIT, kind="full", parent=None, tensors=tensors)
    run(cfg, split, resume=True)
    losses, expected = read_journal(split).losses(), read_journal(straight).losses()
    assert losses[:SPLIT] == expected[:SPLIT]
    assert losses[SPLIT:] != expected[SPLIT:]
