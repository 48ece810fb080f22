"""Two ranks under torchrun with DDP (gloo): bit-exact resume and agreement with one rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.records.journal import read_journal
from reference_trainer.processes.collective_counts import counts, culprits

from .conftest import run_module, torchrun
from .test_trainer import assert_same_tensors, final_state

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TINY = ["--preset", "tiny", "--log-every", "1000"]


def _ok(proc: object) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]  # type: ignore[attr-defined]


BATCH_OF_4 = [*TINY, "--steps", "10", "--batch-size", "4", "--checkpoint-every", "5"]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks, 4 sequences each, 10 steps, a checkpoint every 5: the uninterrupted run
    of the resume test and the two-rank side of the comparisons with one rank."""
    run_dir = tmp_path_factory.mktemp("ddp") / "run"
    _ok(torchrun(2, *BATCH_OF_4, "--run-dir", str(run_dir)))
    return run_dir


def test_two_rank_resume_is_bit_exact(ddp_run: Path, tmp_path: Path) -> None:
    straight, split = ddp_run, tmp_path / "split"
    _ok(torchrun(2, *BATCH_OF_4, "--stop-after", "5", "--run-dir", str(split)))
    latest = split / "checkpoints" / "step-00000005"
    assert sorted(p.name for p in latest.iterdir()) == [
        "manifest.json",
        "rng-rank-0.pt",
        "rng-rank-1.pt",
        "state.pt",
    ]
    _ok(torchrun(2, *BATCH_OF_4, "--resume", "--run-dir", str(split)))

    a, b = read_journal(straight), read_journal(split)
    assert a.ranks == b.ranks == [0, 1]
    # The split run stopped after step 5 and its second launch trained steps 6 to 10.
    loaded = [Path(e["path"]).name for e in b.of_kind("checkpoint_loaded") if e.rank == 0]
    assert loaded == ["step-00000005"]
    # Negative control of the straggler scores and the collective watchdog: clean runs
    # name nobody, and both ranks entered the same number of all-reduces.
    assert [e for e in (*a, *b) if e.kind == "rank_blamed"] == []
    seqs = counts(straight, 2, 0)
    assert len(seqs) == 2 and culprits(seqs, 2) == [] and seqs[0] > 10
    for rank in (0, 1):
        assert len(a.losses(rank)) == 10
        assert a.losses(rank) == b.losses(rank)
        local = [a.steps(rank)[s]["local_loss"] for s in range(1, 11)]
        assert local == [b.steps(rank)[s]["local_loss"] for s in range(1, 11)]
    # The two ranks trained on different shards but agree on the global loss.
    assert a.steps(0)[5]["local_loss"] != a.steps(1)[5]["local_loss"]
    assert a.losses(0) == a.losses(1)
    sa, sb = final_state(straight), final_state(split)
    assert_same_tensors(sa["model"], sb["model"], "model")
    assert_same_tensors(sa["optimizer"], sb["optimizer"], "optimizer")


def test_two_ranks_match_one_rank_with_gradient_accumulation(ddp_run: Path, tmp_path: Path) -> None:
    accum_dir = tmp_path / "accum"
    _ok(
        run_module(
            "-m", "reference_trainer", *BATCH_OF_4, "--grad-accum", "2", "--run-dir", str(accum_dir)
        )
    )
    ddp, accum = final_state(ddp_run), final_state(accum_dir)
    worst = 0.0
    for name, tensor in ddp["model"].items():  # type: ignore[attr-defined]
        other = accum["model"][name]  # type: ignore[index]
        assert torch.allclose(tensor, other, rtol=1e-4, atol=1e-5), name
        worst = max(worst, float((tensor - other).abs().max()))
    # Both really trained: the check is not comparing initial weights.
    losses = read_journal(ddp_run).losses()
    assert losses[-1] < losses[0]
    assert read_journal(accum_dir).losses() == pytest.approx(losses, rel=1e-5)
    print(f"largest parameter difference after 10 steps: {worst:.2e}")


def test_two_ranks_differ_from_one_rank_with_half_the_batch(ddp_run: Path, tmp_path: Path) -> None:
    """Negative control: the comparison above does fail when the global batch differs."""
    half_dir = tmp_path / "half"
    _ok(run_module("-m", "reference_trainer", *BATCH_OF_4, "--run-dir", str(half_dir)))
    ddp, half = final_state(ddp_run), final_state(half_dir)
    assert not all(
        torch.allclose(t, half["model"][n], rtol=1e-4, atol=1e-5)  # type: ignore[index]
        for n, t in ddp["model"].items()  # type: ignore[attr-defined]
    )


def test_two_ranks_agree_on_the_quality_sampling_weights(tmp_path: Path) -> None:
    """Every rank reads the whole stream and keeps its share, so every rank must draw the
    same sources: the weights come from totals reduced over ranks, the same on each."""
    run_dir = tmp_path / "run"
    args = [*TINY, "--steps", "10", "--data-mix", "llama", "--enable", "quality_sampling"]
    _ok(torchrun(2, *args, "--run-dir", str(run_dir)))
    journal = read_journal(run_dir)
    events = {r: [e.fields for e in journal.of_kind("data_weights") if e.rank == r] for r in (0, 1)}
    assert [e.step for e in journal.of_kind("data_weights") if e.rank == 0] == [10]
    assert events[0] == events[1]
    weights = events[0][0]["weights"]
    assert weights != {"web": 0.60, "encyclopedia": 0.15, "code": 0.25}  # they moved
    assert journal.losses(0) == journal.losses(1)
