"""What the attached agent observes of a trainer that makes no claims: steps with or without
torch.optim, skipped updates, gradient accumulation, file saves and loads; and that it
leaves no trace in the trainer's model or files."""

from __future__ import annotations

import copy
import io
import math
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import harness
from faults import FaultPlan
from harness.records.journal import Journal, read_journal

from .plain_train import VOCAB, Net

NAN_AT_3 = FaultPlan.from_dict({"faults": [{"kind": "nan_grad", "at_step": 3}]})


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(i)
    tokens = (torch.randint(0, VOCAB, (8, 1), generator=gen) + torch.arange(13)) % VOCAB
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model: nn.Module, i: int) -> torch.Tensor:
    x, y = batch(i)
    return nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def finite_grads(model: nn.Module) -> bool:
    return all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def run(tmp_path: Path, loop: Callable[..., None], plan: FaultPlan | None = None,
        optimizer: bool = True) -> Journal:  # fmt: skip
    """``loop(model, optimizer)`` (or ``loop(model)`` with no optimizer) with the agent
    attached; the run's journal."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer else None
    with harness.attach(model, opt, run_dir=tmp_path, plan=plan):
        loop(model, opt) if opt is not None else loop(model)
    return read_journal(tmp_path)


def skipped(journal: Journal) -> dict[int, object]:
    return {s: e.get("skipped") for s, e in journal.steps().items()}


def test_a_guard_that_skips_the_poisoned_step_is_seen_skipping(tmp_path: Path) -> None:
    def guarded(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        for i in range(5):
            loss_of(model, i).backward()
            if finite_grads(model):  # the guard sees the NaN: it came during backward
                opt.step()
            opt.zero_grad()

    journal = run(tmp_path, guarded, NAN_AT_3)
    assert skipped(journal) == {1: False, 2: False, 3: True, 4: False, 5: False}
    [end] = journal.of_kind("run_end")
    assert end["params_finite"] is True


def test_without_the_guard_the_nan_reaches_the_weights(tmp_path: Path) -> None:
    def unguarded(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        for i in range(5):
            loss_of(model, i).backward()
            opt.step()
            opt.zero_grad()

    journal = run(tmp_path, unguarded, NAN_AT_3)
    assert skipped(journal) == dict.fromkeys(range(1, 6), False)
    assert journal.steps()[3]["params_finite"] is False
    assert journal.of_kind("run_end")[0]["params_finite"] is False


def test_clipping_sees_the_nan_before_the_update(tmp_path: Path) -> None:
    def strict(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        for i in range(4):
            loss_of(model, i).backward()
            try:
                nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
            except RuntimeError:
                opt.zero_grad()
                continue
            opt.step()
            opt.zero_grad()

    journal = run(tmp_path, strict, NAN_AT_3)
    assert skipped(journal) == {1: False, 2: False, 3: True, 4: False}


def test_manual_updates_count_as_steps(tmp_path: Path) -> None:
    def manual(model: nn.Module) -> None:
        for i in range(4):
            loss_of(model, i).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
            model.zero_grad()

    journal = run(tmp_path, manual, optimizer=False)
    assert skipped(journal) == dict.fromkeys(range(1, 5), False)
    assert all(math.isfinite(e["loss"]) for e in journal.steps().values())


def test_a_manual_guard_skipping_the_nan_is_seen(tmp_path: Path) -> None:
    def manual_guarded(model: nn.Module) -> None:
        for i in range(5):
            loss_of(model, i).backward()
            if finite_grads(model):
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.1)
            model.zero_grad()

    journal = run(tmp_path, manual_guarded, NAN_AT_3, optimizer=False)
    assert skipped(journal) == {1: False, 2: False, 3: True, 4: False, 5: False}


def test_gradient_accumulation_is_one_step(tmp_path: Path) -> None:
    def accumulate(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        for step in range(3):
            for micro in range(4):
                (loss_of(model, step * 4 + micro) / 4).backward()
            opt.step()
            opt.zero_grad()

    journal = run(tmp_path, accumulate)
    assert sorted(journal.steps()) == [1, 2, 3]


def test_gradient_faults_act_during_backward_at_their_step(tmp_path: Path) -> None:
    seen: list[bool] = []

    def record(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        for i in range(4):
            loss_of(model, i).backward()
            seen.append(finite_grads(model))
            opt.zero_grad()  # never steps: the weights stay clean

    journal = run(tmp_path, record, NAN_AT_3)
    assert seen == [True, True, False, True]
    [fault] = journal.of_kind("fault_injected")
    assert (fault.step, fault["details"]["at"]) == (3, "backward")


def test_an_attached_model_copies_and_saves_without_the_agent(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with harness.attach(model, opt, run_dir=tmp_path / "run"):
        loss_of(model, 0).backward()
        opt.step()
        twin = copy.deepcopy(model)  # an EMA copy, say
        buffer = io.BytesIO()
        torch.save(model, buffer)
        torch.save({"model": twin}, tmp_path / "whole.pt")
        pickle.dumps(model)
        assert model._forward_pre_hooks  # the agent's own hook is back after the save
    assert b"harness" not in buffer.getvalue()
    assert b"harness" not in (tmp_path / "whole.pt").read_bytes()
    loaded = torch.load(tmp_path / "whole.pt", weights_only=False)["model"]
    x, _ = batch(1)
    assert torch.equal(loaded(x), twin(x))
    assert sorted(read_journal(tmp_path / "run").steps()) == [1]  # the twin's forward: no step


def test_saves_and_loads_are_journaled_with_their_hash(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "ckpt.pt"
    with harness.attach(model, opt, run_dir=tmp_path / "run"):
        for i in range(2):
            loss_of(model, i).backward()
            opt.step()
            opt.zero_grad()
        torch.save(model.state_dict(), path)
        model.load_state_dict(torch.load(path))  # intact
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x40  # a flipped bit in the tensor data
        path.write_bytes(bytes(raw))
        torch.load(path)  # corrupted, and it loads
        (tmp_path / "elsewhere.pt").write_bytes(path.read_bytes())
        torch.load(tmp_path / "elsewhere.pt")  # never saved by the run
        with pytest.raises(FileNotFoundError):
            torch.load(tmp_path / "missing.pt")
    journal = read_journal(tmp_path / "run")
    [save] = journal.of_kind("file_saved")
    assert (save["path"], save.step) == (str(path), 2)
    loads = journal.of_kind("file_loaded")
    assert [e["intact"] for e in loads] == [True, False, None]
    assert loads[0]["sha256"] == save["sha256"] != loads[1]["sha256"]
    assert loads[1]["saved_step"] == 2
    [failed] = journal.of_kind("file_load_failed")  # a load that raised, a missing file too
    assert failed["sha256"] is None and failed["error"].startswith("FileNotFoundError")


def test_a_distributed_checkpoint_folder_is_observed_too(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    folder = tmp_path / "dcp"
    with harness.attach(model, opt, run_dir=tmp_path / "run"):
        loss_of(model, 0).backward()
        opt.step()
        state = {"model": model.state_dict()}
        dcp.save(state, checkpoint_id=folder, no_dist=True)
        dcp.load(state, checkpoint_id=folder, no_dist=True)
        victim = next(p for p in sorted(folder.iterdir()) if p.suffix == ".distcp")
        raw = bytearray(victim.read_bytes())
        raw[-9] ^= 0x01
        victim.write_bytes(bytes(raw))
        dcp.load(state, checkpoint_id=folder, no_dist=True)
    journal = read_journal(tmp_path / "run")
    [save] = journal.of_kind("file_saved")
    assert save["path"] == str(folder) and save["api"] == "torch.distributed.checkpoint.save"
    assert [e["intact"] for e in journal.of_kind("file_loaded")] == [True, False]


def test_safetensors_files_are_observed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    path = tmp_path / "model.safetensors"
    with harness.attach(model, None, run_dir=tmp_path / "run"):
        # Names bound after attaching (exec attaches before the program imports anything).
        from safetensors.torch import load_file, save_file

        save_file(model.state_dict(), str(path))
        model.load_state_dict(load_file(str(path)))
    journal = read_journal(tmp_path / "run")
    [save] = journal.of_kind("file_saved")
    [load] = journal.of_kind("file_loaded")
    assert save["api"] == "safetensors.save_file" and load["intact"] is True


def test_a_trainer_may_claim_a_detection_and_it_counts_with_a_deed_behind_it(
    tmp_path: Path,
) -> None:
    from harness.oracles.detection import DetectedOracle
    from harness.oracles.verdict import Evidence

    def claims_and_skips(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        for i in range(5):
            loss_of(model, i).backward()
            if finite_grads(model):
                opt.step()
            else:
                harness.claim("my_guard", reason="non-finite gradient")
            opt.zero_grad()

    def only_claims(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        for i in range(5):
            loss_of(model, i).backward()
            if not finite_grads(model):
                harness.claim("my_guard")
            opt.step()  # ... and updates anyway
            opt.zero_grad()

    oracle = DetectedOracle(within_steps=0, detectors=("my_guard",))
    for loop, passes in ((claims_and_skips, True), (only_claims, False)):
        run_dir = tmp_path / loop.__name__
        journal = run(run_dir, loop, NAN_AT_3)
        said = journal.of_kind("detected")[0]  # (the NaN weights of only_claims say it again)
        assert (said.step, said["detector"]) == (3, "my_guard")
        check = oracle.judge(Evidence(journal=journal, run_dir=run_dir, target_steps=5))
        assert check.passed is passes, check.detail
    harness.claim("my_guard")  # outside an attached run: nothing, no error
