"""Checkpoints on disk: atomic layout, manifests, deltas, verified loads with fallback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.records.events import Reported
from harness.run_layout import RunLayout
from reference_trainer.checkpoints import files
from reference_trainer.checkpoints.manager import CheckpointConfig, CheckpointManager
from reference_trainer.errors import CheckpointError


def _state(step: int) -> dict[str, Any]:
    torch.manual_seed(0)
    w = torch.randn(64, 32) + step * 1e-3  # nearby steps differ a little, as in training
    return {
        "step": step,
        "model": {"w": w, "b": torch.full((32,), float(step))},
        "optimizer": {"state": {0: {"exp_avg": w * 0.1}}, "param_groups": [{"lr": 0.1}]},
        "scaler": {},
        "data": {"position": step},
    }


class Journal:
    """Collects the claims a manager makes."""

    def __init__(self) -> None:
        self.claims: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, claim: Reported, step: int | None = None) -> None:
        self.claims.append((claim.kind, claim.fields()))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.claims]


def manager(run_dir: Path, journal: Journal | None = None, **config: Any) -> CheckpointManager:
    """A rank-0 manager of ``run_dir``, which gets a run id as a fresh run does."""
    config.setdefault("asynchronous", False)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not RunLayout(run_dir).run_id.exists():
        files.new_run_id(run_dir)
    return CheckpointManager(
        run_dir,
        CheckpointConfig(**config),
        rank=0,
        keep=10,
        barrier=lambda: None,
        claim=journal or Journal(),
    )


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_save_publishes_a_complete_directory_with_manifest_then_latest(tmp_path: Path) -> None:
    journal = Journal()
    m = manager(tmp_path, journal)
    m.save(20, _state(20))
    path = tmp_path / "checkpoints" / "step-00000020"
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "rng-rank-0.pt", "state.pt"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000020\n"
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 20 and manifest["kind"] == "full"
    assert set(manifest["tensors"]) == {"model.w", "model.b", "optimizer.state.0.exp_avg"}
    assert journal.kinds() == ["checkpoint_saved"]
    loaded_path, state = m.load_valid()
    assert loaded_path == path
    assert_same(state, _state(20))


def test_deltas_between_fulls_restore_bit_exactly(tmp_path: Path) -> None:
    m = manager(tmp_path, full_every=3)
    for step in (10, 20, 30, 40):
        m.save(step, _state(step))
    kinds = [
        json.loads((p / "manifest.json").read_text())["kind"]
        for p in files.complete_checkpoints(tmp_path)
    ]
    assert kinds == ["full", "delta", "delta", "full"]
    delta = tmp_path / "checkpoints" / "step-00000030"
    assert (delta / "delta.bin").exists() and not (delta / "state.pt").exists()
    fresh = manager(tmp_path)
    for step in (10, 20, 30, 40):
        assert_same(fresh.load(tmp_path / "checkpoints" / f"step-{step:08d}"), _state(step))


def test_a_corrupted_delta_link_falls_back_to_the_full_checkpoint(tmp_path: Path) -> None:
    journal = Journal()
    m = manager(tmp_path, journal, full_every=4)
    for step in (10, 20, 30):
        m.save(step, _state(step))
    for name in ("step-00000020", "step-00000030"):  # damage both deltas of the chain
        blob = tmp_path / "checkpoints" / name / "delta.bin"
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0x10
        blob.write_bytes(bytes(data))
    path, state = m.load_valid()
    assert path.name == "step-00000010"
    assert_same(state, _state(10))
    rejected = [f for k, f in journal.claims if k == "checkpoint_rejected"]
    assert [Path(f["path"]).name for f in rejected] == ["step-00000030", "step-00000020"]
    assert all("does not match its hash" in f["reason"] for f in rejected)


def test_without_integrity_checks_a_damaged_checkpoint_is_trusted(tmp_path: Path) -> None:
    """Negative control: with verification off, a flipped bit in the data goes unseen."""
    m = manager(tmp_path, integrity=False, delta=False)
    m.save(10, _state(10))
    state_file = tmp_path / "checkpoints" / "step-00000010" / "state.pt"
    data = bytearray(state_file.read_bytes())
    offset = data.find(_state(10)["model"]["b"].numpy().tobytes())
    assert offset > 0
    data[offset + 3] ^= 0x40  # an exponent bit of the first bias value
    state_file.write_bytes(bytes(data))
    _, state = m.load_valid()
    assert state["model"]["b"][0] != 10.0  # garbage went in, unnoticed
    with pytest.raises(CheckpointError, match="does not match its hash"):
        manager(tmp_path).load_valid()


def test_background_save_reports_its_stall_and_lands(tmp_path: Path) -> None:
    journal = Journal()
    m = manager(tmp_path, journal, asynchronous=True)
    m.save(10, _state(10))
    m.wait()
    ((kind, fields),) = journal.claims
    assert kind == "checkpoint_saved" and fields["stall_seconds"] <= fields["seconds"] + 1
    assert files.latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-00000010"


def test_an_unfinished_save_never_becomes_latest(tmp_path: Path) -> None:
    m = manager(tmp_path)
    m.save(20, _state(20))
    half = tmp_path / "checkpoints" / ".step-00000040.tmp"  # a save killed mid-way
    half.mkdir()
    (half / "state.pt").write_bytes(b"\x80\x02partial")
    assert files.latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-00000020"
    assert m.load_valid()[0].name == "step-00000020"
    m.save(40, _state(40))  # the next save of that step completes over the leftovers
    assert m.load_valid()[1]["step"] == 40


def test_a_partial_checkpoint_without_manifest_is_rejected(tmp_path: Path) -> None:
    journal = Journal()
    m = manager(tmp_path, journal)
    m.save(20, _state(20))
    m.save(40, _state(40))
    (tmp_path / "checkpoints" / "step-00000040" / "manifest.json").unlink()
    assert m.load_valid()[0].name == "step-00000020"
    ((_, rejected),) = [c for c in journal.claims if c[0] == "checkpoint_rejected"]
    assert "manifest.json is missing" in rejected["reason"]


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch PWNED",))


def test_loading_never_unpickles_arbitrary_objects(tmp_path: Path) -> None:
    m = manager(tmp_path, integrity=False, delta=False)
    m.save(20, _state(20))
    torch.save(
        {"step": 20, "model": _Payload()}, tmp_path / "checkpoints" / "step-00000020" / "state.pt"
    )
    with pytest.raises(CheckpointError, match=r"state\.pt is unreadable"):
        m.load_valid()
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_truncated_and_missing_files_are_named(tmp_path: Path) -> None:
    m = manager(tmp_path, integrity=False, delta=False)
    m.save(20, _state(20))
    state = tmp_path / "checkpoints" / "step-00000020" / "state.pt"
    state.write_bytes(state.read_bytes()[:300])
    with pytest.raises(CheckpointError, match=r"step-00000020/state\.pt is unreadable"):
        m.load_valid()
    state.unlink()
    with pytest.raises(CheckpointError, match=r"state\.pt is missing"):
        m.load_valid()


def test_latest_is_only_a_hint(tmp_path: Path) -> None:
    m = manager(tmp_path)
    m.save(10, _state(10))
    m.save(20, _state(20))
    pointer = tmp_path / "checkpoints" / "latest"
    newest = tmp_path / "checkpoints" / "step-00000020"
    pointer.write_text("step-00000099\n")  # names nothing: the newest by name
    assert files.latest_checkpoint(tmp_path) == newest
    pointer.write_text("../../etc\n")
    assert files.latest_hint(tmp_path) is None
    assert files.latest_checkpoint(tmp_path) == newest
    pointer.unlink()
    os.mkfifo(pointer)  # reading a FIFO would block: it is never opened for reading
    assert files.latest_hint(tmp_path) is None
    assert m.load_valid()[0] == newest


def test_retention_keeps_the_newest_the_bases_of_deltas_and_the_verified(tmp_path: Path) -> None:
    m = manager(tmp_path, full_every=4)
    m.keep = 2
    for step in (10, 20, 30, 40, 50):
        m.save(step, _state(step))
    # 10 full, 20-40 deltas of 10, 50 full: the newest two are 40 (needs 10) and 50.
    left = [p.name for p in files.complete_checkpoints(tmp_path)]
    assert left == ["step-00000010", "step-00000040", "step-00000050"]
    fresh = manager(tmp_path)
    assert_same(fresh.load(tmp_path / "checkpoints" / "step-00000040"), _state(40))


def test_rng_states_round_trip(tmp_path: Path) -> None:
    import random

    import numpy as np

    manager(tmp_path).save(1, _state(1))
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(5), random.random()  # move every generator on
    rng = files.load_rng(tmp_path / "checkpoints" / "step-00000001", 0)
    assert rng is not None
    files.set_rng_state(rng)
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_retention_keeps_one_checkpoint_far_enough_back_for_an_fp32_retry(tmp_path: Path) -> None:
    m = manager(tmp_path, full_every=1)
    m.keep, m.keep_back = 2, 30
    for step in range(10, 101, 10):
        m.save(step, _state(step))
    left = [files.checkpoint_step(p) for p in files.complete_checkpoints(tmp_path)]
    assert left == [70, 80, 90, 100]  # from 70, the newest at least 30 steps before 100
    m.keep_back = 0
    m.save(110, _state(110))
    assert [files.checkpoint_step(p) for p in files.complete_checkpoints(tmp_path)] == [100, 110]


def test_a_file_changed_after_its_hash_was_checked_is_refused_as_read(tmp_path: Path) -> None:
    """Found by a soak: rank 1's disk fault struck a checkpoint between rank 0's manifest
    check and its read of the files. What is loaded is now hashed as it is read."""
    manager(tmp_path).save(1, _state(1))
    ckpt = tmp_path / "checkpoints" / "step-00000001"
    sha = json.loads((ckpt / "manifest.json").read_text())["files"]["state.pt"]["sha256"]
    assert files.load_file(ckpt / "state.pt", sha)["step"] == 1
    data = bytearray((ckpt / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0x10  # after the check: a flip in the tensor bytes
    (ckpt / "state.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="changed after it was verified"):
        files.load_file(ckpt / "state.pt", sha)
    assert files.load_file(ckpt / "state.pt")["step"] == 1  # unchecked, it would have loaded


def test_a_verified_load_keeps_the_rng_states_it_read_with_the_state(tmp_path: Path) -> None:
    manager(tmp_path).save(1, _state(1))
    ckpt = tmp_path / "checkpoints" / "step-00000001"
    reader = manager(tmp_path)
    path, _ = reader.load_valid()
    read = files.load_rng(ckpt, 0)
    (ckpt / files.rng_file(0)).write_bytes(b"damaged after the load was verified")
    kept = reader.rng_of(path)
    assert kept is not None and read is not None
    assert_same(kept, read)  # what was verified, not what is on disk now
    with pytest.raises(CheckpointError, match="unreadable"):
        manager(tmp_path).rng_of(path)  # a manager that verified nothing reads the disk


@pytest.mark.parametrize(
    ("agreeing", "steps"), [(True, {"a": 1, "b": 1}), (False, {"a": 2, "b": 1})]
)
def test_ranks_agree_on_the_oldest_checkpoint_any_of_them_could_verify(
    tmp_path: Path, agreeing: bool, steps: dict[str, int]
) -> None:
    """Found by a soak: one rank verified a checkpoint that a fault damaged before another
    rank read it, and the ranks resumed from different steps. Two managers of one run dir
    stand in for two ranks (threads); their ``agree`` is the min/max exchange torch's
    all-reduce does in the trainer. Without it (the negative control) they part ways."""
    import threading

    writer = manager(tmp_path)
    writer.save(1, _state(1))
    writer.save(2, _state(2))
    values: dict[str, int] = {}
    rounds = threading.Barrier(2)
    a_loaded = threading.Event()

    def agree(who: str) -> Any:
        def exchange(step: int) -> tuple[int, int]:
            values[who] = step
            a_loaded.set()
            rounds.wait()
            low, high = min(values.values()), max(values.values())
            rounds.wait()  # both have read this round before the next one writes
            return low, high

        return exchange

    loaded: dict[str, int] = {}

    def rank(who: str) -> None:
        m = manager(tmp_path)
        if agreeing:
            m.agree = agree(who)
        _, state = m.load_valid()
        loaded[who] = state["step"]
        a_loaded.set()

    first = threading.Thread(target=rank, args=("a",))
    first.start()
    a_loaded.wait(10)  # rank a verified and loaded step 2 (and waits to agree)
    newest = tmp_path / "checkpoints" / "step-00000002"
    data = next(f for f in ("delta.bin", "state.pt") if (newest / f).exists())  # a delta or full
    (newest / data).write_bytes(b"damaged before rank b read it")
    second = threading.Thread(target=rank, args=("b",))
    second.start()
    first.join(10)
    second.join(10)
    assert loaded == steps
