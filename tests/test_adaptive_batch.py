"""The rule of the adaptive batch split (`reference_trainer/stability/adaptive_batch.py`) and
what it measures (`batch_probe.py`): every split keeps the rank's share of the batch, the
largest micro-batch that fits the memory limit is chosen unless a smaller one is measured
clearly faster, and the measurements leave the run's random state alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reference_trainer.config import preset
from reference_trainer.errors import ConfigError
from reference_trainer.stability.adaptive_batch import (
    AdaptiveBatchConfig,
    Memory,
    Split,
    choose,
    fitting,
    splits,
)
from reference_trainer.stability.batch_probe import probe_model, sequence_mb, step_seconds
from reference_trainer.stability.precision import Precision


def test_every_split_keeps_the_rank_share_of_the_batch() -> None:
    assert splits(12) == [
        Split(1, 12),
        Split(2, 6),
        Split(3, 4),
        Split(4, 3),
        Split(6, 2),
        Split(12, 1),
    ]
    assert all(s.micro * s.accum == 12 for s in splits(12))
    assert splits(7) == [Split(1, 7), Split(7, 1)]


def test_the_largest_micro_batch_that_fits_the_limit_is_chosen() -> None:
    assert fitting(8, 1.5, 6.1) == [Split(1, 8), Split(2, 4), Split(4, 2)]
    assert choose(8, 1.5, 6.1) == (Split(4, 2), "largest micro-batch that fits the memory limit")
    assert choose(8, 1.5, 100.0)[0] == Split(8, 1)
    assert choose(8, 1.5, 2.9)[0] == Split(1, 8)
    split, why = choose(8, 1.5, 1.0)  # not even one sequence: the smallest there is
    assert split == Split(1, 8) and why.startswith("none fits")


def test_a_smaller_micro_batch_wins_only_when_measured_clearly_faster() -> None:
    times = {1: 0.50, 2: 0.30, 4: 0.40, 8: 0.10}  # 8 does not fit the limit below
    assert choose(8, 1.0, 4.0, times, 0.1)[0] == Split(2, 4)  # 0.30 < 0.9 x 0.40
    close = {1: 0.50, 2: 0.30, 4: 0.31}
    assert choose(8, 1.0, 4.0, close, 0.1)[0] == Split(4, 2)  # within the margin: largest
    assert choose(8, 1.0, 4.0, close, 0.0)[0] == Split(2, 4)


def test_the_limit_is_the_headroom_less_the_reserve_and_at_most_the_step_memory() -> None:
    mem = Memory(budget=1000.0, used=600.0)
    assert mem.headroom == 400.0
    assert mem.limit(AdaptiveBatchConfig(reserve=0.25)) == 300.0
    assert mem.limit(AdaptiveBatchConfig(reserve=0.25, step_memory_mb=50.0)) == 50.0
    assert Memory(budget=500.0, used=600.0).limit(AdaptiveBatchConfig()) == 0.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("memory_budget_mb", -1.0, "stability.adaptive_batch.memory_budget_mb must be a finite"),
        ("reserve", 1.0, r"stability.adaptive_batch.reserve must be a number in \[0, 1\)"),
        ("time_margin", "x", r"stability.adaptive_batch.time_margin must be a number in \[0, 1\)"),
        ("measure_time", 1, "stability.adaptive_batch.measure_time must be true or false"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AdaptiveBatchConfig(**{field: value})  # type: ignore[arg-type]


def test_adaptive_batch_and_dynamic_batching_are_refused_together() -> None:
    cfg = preset("tiny")
    cfg.enable("adaptive_batch")
    with pytest.raises(ConfigError, match="dynamic_batching and adaptive_batch"):
        cfg.enable("dynamic_batching")


def test_the_measurements_grow_with_the_model_and_leave_the_random_state_alone() -> None:
    cfg = preset("tiny").model_config()
    fp32 = Precision("fp32", "cpu")
    before = torch.get_rng_state()
    with probe_model(cfg, torch.device("cpu")) as model:
        per_sequence = sequence_mb(model, fp32)
        timed = step_seconds(model, fp32, splits(4), repeats=1)
        assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), before)
    # At least the logits and their log-softmax: 2 x block_size x vocab x 4 bytes.
    assert per_sequence >= 2 * cfg.block_size * cfg.vocab_size * 4 / 2**20
    with probe_model(
        dataclasses.replace(cfg, n_layer=cfg.n_layer * 2), torch.device("cpu")
    ) as deeper:
        assert sequence_mb(deeper, fp32) > per_sequence
    assert sorted(timed) == [1, 2, 4] and all(t > 0 for t in timed.values())
