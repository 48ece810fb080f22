"""The adaptive batch split in real (tiny) runs: the split is decided from the memory limit,
journaled, decided again after a restart with another budget, and every split trains the
same global batch: the losses match the unsplit run's to float tolerance.

Tolerance: a split changes only the order of floating-point sums (a step's loss is the mean
of its micro-batches' means, the gradient the sum of theirs), each rounding at about 1e-7
relative in fp32; Adam's updates carry the difference on, and over these 8 steps it stays
well under 1e-4 relative (measured: 7.1e-8), while one window more or less in a step
moves the loss by about 1e-2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.records.journal import read_journal
from reference_trainer.config import TrainConfig
from reference_trainer.stability.batch_probe import probe_model, sequence_mb
from reference_trainer.stability.precision import Precision
from tests.test_trainer import final_state, run, tiny

pytestmark = pytest.mark.slow

STEPS, SPLIT = 8, 4
REL = 1e-4


def _config(*, sequences: float | None) -> TrainConfig:
    """Batch 8 a rank; with ``sequences``, adaptive with room for that many sequences'
    activations per micro-batch (not timed, so the choice is the memory's alone)."""
    cfg = tiny(steps=STEPS, checkpoint_every=SPLIT)
    if sequences is not None:
        cfg.enable("adaptive_batch")
        per_sequence = _sequence_mb(cfg)
        cfg.stability.adaptive_batch.step_memory_mb = sequences * per_sequence
        cfg.stability.adaptive_batch.measure_time = False
    return TrainConfig.from_dict(cfg.to_dict())


def _sequence_mb(cfg: TrainConfig) -> float:
    with probe_model(cfg.model_config(), torch.device("cpu")) as model:
        return sequence_mb(model, Precision("fp32", "cpu"))


@pytest.fixture(scope="module")
def unsplit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("adaptive") / "unsplit"
    run(_config(sequences=None), run_dir)
    return run_dir


def test_a_resume_on_another_budget_splits_differently_and_trains_the_same_batch(
    unsplit: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "split"
    run(_config(sequences=2.5), run_dir, stop_after=SPLIT)
    run(_config(sequences=4.5), run_dir, resume=True)  # another machine: more room
    journal = read_journal(run_dir)
    decisions = [
        (e.step, e["micro_batch"], e["grad_accum"], e["global_batch"])
        for e in journal.of_kind("batch_split")
    ]
    assert decisions == [(1, 2, 4, 8), (SPLIT + 1, 4, 2, 8)]
    base = read_journal(unsplit)
    assert not list(base.of_kind("batch_split"))  # off: nothing decided, nothing journaled
    steps = {e.step: e for e in journal.of_kind("step")}
    expected = {e.step: e for e in base.of_kind("step")}
    assert sorted(steps) == sorted(expected) == list(range(1, STEPS + 1))
    for step, event in steps.items():
        assert event["tokens"] == expected[step]["tokens"]
        assert event["loss"] == pytest.approx(expected[step]["loss"], rel=REL), step
    assert journal.losses() != base.losses()  # split for real: not bit-identical
    a, b = final_state(unsplit)["model"], final_state(run_dir)["model"]
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=REL, atol=1e-6, msg=name)


def test_a_split_that_drops_windows_is_caught(unsplit: Path, tmp_path: Path) -> None:
    """Negative control for the tolerance: half the batch (micro 4, no accumulation) is
    not within it."""
    cfg = tiny(steps=STEPS, checkpoint_every=SPLIT, batch_size=4)
    run(cfg, tmp_path / "half")
    losses, expected = read_journal(tmp_path / "half").losses(), read_journal(unsplit).losses()
    assert any(abs(x - y) > REL * abs(y) for x, y in zip(losses[1:], expected[1:], strict=True))
