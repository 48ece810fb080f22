"""Dynamic batching and checkpoints every N tokens in a real (tiny) run: bit-exact resume,
saves at the steps the journal's token counts call for, and the count kept over a resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.records.journal import read_journal
from reference_trainer.checkpoints import files as ckpt
from reference_trainer.checkpoints.manifest import describe_tensors, write_manifest
from reference_trainer.cli import main as trainer

from .test_trainer import assert_same_tensors, final_state, run, tiny

pytestmark = pytest.mark.slow

EVERY = 1500  # tokens: about every three steps of the tiny preset


def dynamic(steps: int) -> dict[str, object]:
    data = tiny().to_dict()["data"]
    data["batching"] = {"enabled": True}
    return {"steps": steps, "data": data, "checkpoint_every_tokens": EVERY, "keep_checkpoints": 20}


def expected_saves(tokens: list[int], last: int) -> list[int]:
    """Steps at or just after each multiple of EVERY, from the journal's counts, and the last."""
    steps, total = [], 0
    for step, n in enumerate(tokens, 1):
        if (total + n) // EVERY > total // EVERY or step == last:
            steps.append(step)
        total += n
    return steps


def saved_steps(run_dir: Path) -> list[int]:
    return [e.step for e in read_journal(run_dir).of_kind("checkpoint_saved")]


def test_dynamic_batching_resumes_bit_exactly_and_saves_every_n_tokens(tmp_path: Path) -> None:
    cfg = tiny(**dynamic(12))
    run(cfg, tmp_path / "straight")
    run(cfg, tmp_path / "split", stop_after=5)
    run(cfg, tmp_path / "split", resume=True)

    straight, split = read_journal(tmp_path / "straight"), read_journal(tmp_path / "split")
    assert len(straight.losses()) == 12
    assert straight.losses() == split.losses()  # exact, not approximate
    a, b = final_state(tmp_path / "straight"), final_state(tmp_path / "split")
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"], b["optimizer"], "optimizer")
    assert_same_tensors(a["data"], b["data"], "data")

    steps = list(straight.of_kind("step"))
    tokens = [e["tokens"] for e in steps]
    budget = cfg.batch_size * (cfg.model.block_size + 1)
    for e in steps:  # whole pieces under the budget: real + padded targets below it
        assert e["pad_tokens"] >= 0 and 0 < e["tokens"] + e["pad_tokens"] < budget
    assert len(set(tokens)) > 1  # not fixed windows in disguise
    want = expected_saves(tokens, 12)
    assert len(want) >= 4
    assert saved_steps(tmp_path / "straight") == want
    # The split run saved at 5 (its stop) and, counting on from the checkpoint, where the
    # straight run did.
    assert saved_steps(tmp_path / "split") == sorted({*(s for s in want if s != 12), 5, 12})
    assert a["trainer"]["tokens_trained"] == sum(tokens)


def test_a_resume_that_loses_the_token_count_saves_elsewhere(tmp_path: Path) -> None:
    """Negative control for the test above: without the saved count the saves move."""
    cfg = tiny(**dynamic(12))
    run(cfg, tmp_path / "split", stop_after=5)
    latest = ckpt.latest_checkpoint(tmp_path / "split")
    assert latest is not None
    state = final_state(tmp_path / "split")
    del state["trainer"]["tokens_trained"]
    torch.save(state, latest / "state.pt")
    (latest / "manifest.json").unlink()  # re-sign the edited checkpoint so it loads
    run_id = ckpt.read_run_id(tmp_path / "split")
    write_manifest(
        latest, run_id=run_id, step=5, kind="full", parent=None, tensors=describe_tensors(state)
    )
    run(cfg, tmp_path / "split", resume=True)
    tokens = [e["tokens"] for e in read_journal(tmp_path / "split").of_kind("step")]
    assert len(tokens) == 12
    want = sorted({*(s for s in expected_saves(tokens, 12) if s != 12), 5, 12})
    assert saved_steps(tmp_path / "split") != want


def test_the_flag_saves_fixed_windows_every_n_tokens(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["--steps", "7", "--checkpoint-every-tokens", "1k", "--keep-checkpoints", "9"]
    assert trainer([*argv, "--run-dir", str(run_dir)]) == 0
    # 512 tokens a step: 1024 at step 2, 2048 at 4, 3072 at 6, and the last step.
    assert saved_steps(run_dir) == [2, 4, 6, 7]
    steps = list(read_journal(run_dir).of_kind("step"))
    assert {e["tokens"] for e in steps} == {512}
    assert all("pad_tokens" not in e.fields for e in steps)  # fixed windows: no padding to report
