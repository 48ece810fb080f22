"""Out of memory, retried with smaller micro-batches (`reference_trainer.stability.oom_retry`):
the split itself, then the reference trainer with an allocation failure injected (the
``oom`` fault: the allocator's own error, in the forward pass), with the retry and without.

With it, the step is redone and the run goes on; the global batch is kept, shown from the
losses the agent observed against a clean run on the same data (every step's loss the same
up to rounding, where half a batch would differ at the first update after the fault).
Without it, the error ends the run, with the cause named: the crash path a restart answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.records.events import Detected, RankBlamed, Recovered
from harness.records.journal import read_journal
from reference_trainer.stability.oom_retry import MicroBatchSplit, OomRetryConfig

from .stability_support import claims, config, run

STEPS = 6
OOM = [{"kind": "oom", "at_step": 3}]


def batch(steps: int = 1, size: int = 8, width: int = 5) -> torch.Tensor:
    return torch.arange(steps * size * width).reshape(steps, size, width)


def test_a_halved_split_cuts_each_micro_batch_in_two_in_order() -> None:
    split = MicroBatchSplit(OomRetryConfig(), rank=1)
    whole = batch(steps=2)
    assert split.split(whole) is whole
    assert split.halve(MemoryError("no room"), whole, step=4)
    cut = split.split(whole)
    assert cut.shape == (4, 4, 5)
    assert torch.equal(cut.reshape(-1, 5), whole.reshape(-1, 5))  # the same rows, in order
    detected, blamed, recovered = split.take_claims()
    assert isinstance(detected, Detected) and detected.detector == "out_of_memory"
    assert detected.details["micro_batch"] == [8, 4] and detected.details["grad_accum"] == [2, 4]
    assert isinstance(blamed, RankBlamed) and blamed.blamed_rank == 1
    assert isinstance(recovered, Recovered) and recovered.action == "micro_batch_halved"
    assert split.take_claims() == []


def test_no_halving_past_one_sequence_or_the_limit() -> None:
    split = MicroBatchSplit(OomRetryConfig(max_halvings=2), rank=0)
    assert split.halve(MemoryError(), batch(size=8), step=1)
    assert split.halve(MemoryError(), batch(size=8), step=1)
    assert not split.halve(MemoryError(), batch(size=8), step=1)  # the limit
    assert split.pieces == 4
    odd = MicroBatchSplit(OomRetryConfig(), rank=0)
    assert not odd.halve(MemoryError(), batch(size=3), step=1)  # 3 sequences: no halves
    with pytest.raises(ValueError, match=r"stability\.oom_retry\.max_halvings"):
        OomRetryConfig(max_halvings=0)


@pytest.mark.slow
def test_an_oom_is_retried_with_the_global_batch_kept_and_without_the_retry_ends_the_run(
    tmp_path: Path,
) -> None:
    """Three 6-step runs of the tiny model in this process (82-94 s on 2 cores at load ~20)."""
    _, clean = run(tmp_path / "clean", config(steps=STEPS))
    result, retried = run(tmp_path / "retried", config(steps=STEPS), OOM)
    assert result.steps == STEPS and result.status == "completed"
    [detected] = claims(retried, "detected", "out_of_memory")
    [recovered] = claims(retried, "recovered", "micro_batch_halved")
    assert detected.step == recovered.step == 3
    assert recovered["details"]["micro_batch"] == [8, 4]
    assert [e["blamed_rank"] for e in retried.of_kind(RankBlamed)] == [0]
    assert len(retried.losses()) == len(clean.losses()) == STEPS
    # The same data, the same mean over it: each step's loss within rounding of the clean
    # run's, from the step that was redone to the last.
    assert retried.losses() == pytest.approx(clean.losses(), rel=1e-5, abs=0)

    with pytest.raises(MemoryError):
        run(tmp_path / "without", config(steps=STEPS, disable=("oom_retry",)), OOM)
    # (The journal is read back here: the run raised before `run` could.)
    without = read_journal(tmp_path / "without", warn=False)
    assert [e.step for e in claims(without, "detected", "out_of_memory")] == [3]
    assert claims(without, "recovered", "micro_batch_halved") == []
    assert max(e.step for e in without.of_kind("step")) == 2  # step 3 never finished
