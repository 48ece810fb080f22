"""The reference trainer, run for real in one process: resume, learning, precisions."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.records.journal import read_journal
from reference_trainer.checkpoints import files as ckpt
from reference_trainer.checkpoints.manager import CheckpointConfig, CheckpointManager
from reference_trainer.checkpoints.manifest import describe_tensors, write_manifest
from reference_trainer.config import TrainConfig, preset
from reference_trainer.train import train

pytestmark = pytest.mark.slow


def tiny(**overrides: object) -> TrainConfig:
    """The tiny preset with some fields changed."""
    data = preset("tiny").to_dict() | overrides
    return TrainConfig.from_dict(data)


def run(cfg: TrainConfig, run_dir: Path, **kwargs: object) -> None:
    """Train in this process with progress lines silenced."""
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg, run_dir, **kwargs)  # type: ignore[arg-type]


def final_state(run_dir: Path) -> dict[str, Any]:
    """The state in the run's latest checkpoint, verified against its manifest."""
    latest = ckpt.latest_checkpoint(run_dir)
    assert latest is not None
    manager = CheckpointManager(
        run_dir,
        CheckpointConfig(),
        rank=0,
        keep=1,
        barrier=lambda: None,
        claim=lambda *a, **k: None,
    )
    return manager.load(latest)


def assert_same_tensors(a: object, b: object, where: str = "") -> None:
    """Every tensor in two nested states is bit-identical."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same_tensors(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


#: Resumed at step 10 of 20: the data buffer runs dry after the resume (its next refill
#: reads the corpus from the restored position), after warmup (5 steps) has ended.
RESUMED = {"steps": 20, "checkpoint_every": 10}


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run of the `RESUMED` configuration, for both resume tests."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    run(tiny(**RESUMED), run_dir)
    return run_dir


def test_resume_is_bit_exact(tmp_path: Path, straight: Path) -> None:
    cfg = tiny(**RESUMED)
    run(cfg, tmp_path / "split", stop_after=10)
    assert ckpt.checkpoint_step(ckpt.latest_checkpoint(tmp_path / "split")) == 10  # type: ignore[arg-type]
    run(cfg, tmp_path / "split", resume=True)

    whole, split = read_journal(straight), read_journal(tmp_path / "split")
    assert len(whole.losses()) == len(split.losses()) == 20
    assert whole.losses() == split.losses()  # exact, not approximate
    a, b = final_state(straight), final_state(tmp_path / "split")
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"], b["optimizer"], "optimizer")
    assert_same_tensors(a["data"], b["data"], "data")
    assert [e.kind for e in split if e.kind in ("run_start", "checkpoint_loaded", "run_end")] == [
        "run_start",
        "run_end",
        "run_start",
        "checkpoint_loaded",
        "run_end",
    ]
    ends = [e["status"] for e in split.of_kind("run_end")]
    assert ends == ["stopped", "completed"]


def test_a_resume_that_loses_the_data_position_is_caught(tmp_path: Path, straight: Path) -> None:
    """Negative control for the test above: the comparison fails when state is lost."""
    cfg = tiny(**RESUMED)
    run(cfg, tmp_path / "split", stop_after=10)
    latest = ckpt.latest_checkpoint(tmp_path / "split")
    assert latest is not None
    state = final_state(tmp_path / "split")
    state["data"]["documents"]["position"] = 0  # the stream restarts from the first document
    state["data"]["buffer"] = torch.zeros(0, dtype=torch.int64)
    torch.save(state, latest / "state.pt")
    (latest / "manifest.json").unlink()  # re-sign the edited checkpoint so it loads
    run_id = ckpt.read_run_id(tmp_path / "split")
    tensors = describe_tensors(state)
    write_manifest(latest, run_id=run_id, step=10, kind="full", parent=None, tensors=tensors)
    run(cfg, tmp_path / "split", resume=True)
    whole, split = read_journal(straight), read_journal(tmp_path / "split")
    assert whole.losses()[:10] == split.losses()[:10]
    assert whole.losses()[10:] != split.losses()[10:]


def test_tiny_loss_falls_below_eight_tenths_within_60_steps(tmp_path: Path) -> None:
    run(tiny(steps=60), tmp_path)
    losses = read_journal(tmp_path).losses()
    assert len(losses) == 60
    initial, late = losses[0], sum(losses[50:60]) / 10
    assert initial == pytest.approx(math.log(2048), rel=0.05)  # an untrained model guesses
    assert late < 0.8 * initial, f"loss went from {initial:.3f} to {late:.3f}"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_each_precision_trains_with_finite_loss(tmp_path: Path, precision: str) -> None:
    run(tiny(steps=12, precision=precision, checkpoint_every=12), tmp_path)
    steps = read_journal(tmp_path).of_kind("step")
    assert len(steps) == 12
    assert all(math.isfinite(e["loss"]) and math.isfinite(e["grad_norm"]) for e in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]
    scales = {e["loss_scale"] for e in steps}
    assert (scales == {None}) == (precision != "fp16"), scales
    model = final_state(tmp_path)["model"]
    assert all(torch.isfinite(t).all() for t in model.values())  # type: ignore[attr-defined]
