"""Checkpoints: atomic layout, the `latest` pointer, safe loading, retention."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from reference_trainer import checkpoint as ckpt
from reference_trainer.errors import CheckpointError


def _state(step: int) -> dict[str, object]:
    return {
        "step": step,
        "model": {"w": torch.full((3,), float(step))},
        "optimizer": {},
        "scaler": {},
        "data": {"next_doc": step},
    }


def _save(run_dir: Path, step: int) -> Path:
    return ckpt.save_checkpoint(run_dir, step, _state(step), rank=0, barrier=lambda: None)


def test_save_publishes_a_complete_directory_then_latest(tmp_path: Path) -> None:
    path = _save(tmp_path, 20)
    assert path == tmp_path / "checkpoints" / "step-00000020"
    assert sorted(p.name for p in path.iterdir()) == ["rng-rank-0.pt", "state.pt"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000020\n"
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    state = ckpt.load_state(ckpt.latest_checkpoint(tmp_path))  # type: ignore[arg-type]
    assert torch.equal(state["model"]["w"], torch.full((3,), 20.0))


def test_rng_states_round_trip(tmp_path: Path) -> None:
    import random

    import numpy as np

    _save(tmp_path, 1)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(5), random.random()  # move every generator on
    ckpt.set_rng_state(ckpt.load_rng(tmp_path / "checkpoints" / "step-00000001", 0))  # type: ignore[arg-type]
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_an_unfinished_save_never_becomes_latest(tmp_path: Path) -> None:
    _save(tmp_path, 20)
    half = tmp_path / "checkpoints" / ".step-00000040.tmp"  # a save killed mid-way
    half.mkdir()
    (half / "state.pt").write_bytes(b"\x80\x02partial")
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-00000020"
    # The next save of that step completes over the leftovers.
    _save(tmp_path, 40)
    assert ckpt.load_state(tmp_path / "checkpoints" / "step-00000040")["step"] == 40


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch PWNED",))


def test_loading_never_unpickles_arbitrary_objects(tmp_path: Path) -> None:
    path = _save(tmp_path, 20)
    torch.save({"step": 20, "model": _Payload()}, path / "state.pt")
    with pytest.raises(CheckpointError, match=r"state\.pt is unreadable"):
        ckpt.load_state(path)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_truncated_and_missing_files_are_named(tmp_path: Path) -> None:
    path = _save(tmp_path, 20)
    data = (path / "state.pt").read_bytes()
    (path / "state.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"step-00000020/state.pt is unreadable"):
        ckpt.load_state(path)
    (path / "state.pt").unlink()
    with pytest.raises(CheckpointError, match=r"state.pt is missing"):
        ckpt.load_state(path)


def test_latest_pointing_nowhere_is_an_error(tmp_path: Path) -> None:
    _save(tmp_path, 20)
    (tmp_path / "checkpoints" / "latest").write_text("step-00000099\n")
    with pytest.raises(CheckpointError, match="step-00000099 does not exist"):
        ckpt.latest_checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "latest").write_text("../../etc\n")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        ckpt.latest_checkpoint(tmp_path)


def test_retention_keeps_the_newest_and_the_latest(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        _save(tmp_path, step)
    removed = ckpt.prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step-00000010", "step-00000020"]
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["latest", "step-00000030", "step-00000040"]
