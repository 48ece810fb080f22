"""Dynamic batching on two ranks: the same steps as one rank with twice the accumulation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.records.journal import read_journal

from .conftest import run_module, torchrun
from .test_trainer import final_state

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

COMMON = ["--preset", "tiny", "--steps", "5", "--batch-size", "4", "--log-every", "1000"]
DYNAMIC = [*COMMON, "--enable", "dynamic_batching"]


def test_two_ranks_train_what_one_rank_with_accumulation_trains(tmp_path: Path) -> None:
    ddp, accum = tmp_path / "ddp", tmp_path / "accum"
    done = torchrun(2, *DYNAMIC, "--run-dir", str(ddp))
    assert done.returncode == 0, done.stderr[-3000:]
    argv = ["-m", "reference_trainer", *DYNAMIC, "--grad-accum", "2", "--run-dir", str(accum)]
    done = run_module(*argv)
    assert done.returncode == 0, done.stderr[-3000:]
    two, one = read_journal(ddp), read_journal(accum)
    # The same micro-batches: the same real-token counts, step by step, on every rank.
    counts = [e["tokens"] for e in one.of_kind("step")]
    for rank in (0, 1):
        assert [two.steps(rank)[s]["tokens"] for s in range(1, 6)] == counts
    assert len(set(counts)) > 1  # whole-document batches, not fixed windows
    # Each rank's share differs; the step's token mean is the one-rank loss.
    assert two.steps(0)[1]["local_loss"] != two.steps(1)[1]["local_loss"]
    assert two.losses(0) == pytest.approx(one.losses(), rel=1e-5)
    a, b = final_state(ddp), final_state(accum)
    for name, tensor in a["model"].items():
        assert torch.allclose(tensor, b["model"][name], rtol=1e-4, atol=1e-5), name
