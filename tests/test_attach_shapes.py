"""Step shapes the frameworks have, followed by the attached agent from evidence.

Lightning steps inside ``optimizer.step(closure)`` and saves through a ``BytesIO``; DCP's
``get_state_dict`` steps a fresh optimizer once to create its state; guards drop every
gradient; resumed trainers may replay steps they trained before their save. Each is run
through ``tests/shaped_train.py`` or an in-process loop, and the journal is checked
against what the trainer really did (its printed loss, the bytes of its files).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import harness
from faults import build_injector
from faults.checkpoint import BitflipFileSpec
from faults.injector import StepContext
from harness.inside.step_identity import number
from harness.records.journal import Journal, read_journal
from harness.running import warm_start

from .plain_train import VOCAB, Net
from .shaped_train import batch, save

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "shaped_train.py")
NAN_AT_4 = "faults:\n  - kind: nan_grad\n    at_step: 4\n    target: 'blocks.0.*'\n"


def exec_run(root: Path, name: str, *args: str) -> tuple[Journal, str, Path]:
    """``tightrope exec`` of shaped_train with a NaN at step 4; (journal, stdout, out dir)."""
    plan, run_dir, out = root / "plan.yaml", root / name / "run", root / name / "out"
    plan.write_text(NAN_AT_4)
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "harness", "exec", "--run-dir", str(run_dir)]
    command += ["--plan", str(plan), "--", sys.executable, SCRIPT, "--out", str(out), *args]
    env = dict(os.environ)  # forked warm when the test session is (tests/conftest.py)
    done = subprocess.run(
        warm_start.warm(command, env), capture_output=True, text=True, timeout=120, cwd=ROOT,
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return read_journal(run_dir), done.stdout, out


@pytest.fixture(scope="module")
def closure_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Journal, str, Path]]:
    root = tmp_path_factory.mktemp("closure")
    shape = ["--shape", "closure", "--save-every", "3"]
    return {
        guard: exec_run(root, guard, *shape, "--guard", guard) for guard in ("off", "none", "zero")
    }


@pytest.mark.slow
def test_steps_inside_a_closure_are_found_with_their_loss_and_model(
    closure_runs: dict[str, tuple[Journal, str, Path]],
) -> None:
    journal, out, _ = closure_runs["off"]
    steps = journal.steps()
    assert sorted(steps) == list(range(1, 9))
    # The loss is the closure's, observed at its backward: finite before the NaN, and the
    # same number the trainer printed at its last step (NaN: the unguarded update went in).
    assert all(math.isfinite(steps[s]["loss"]) for s in (1, 2, 3, 4))
    assert out.strip() == "final loss nan" and math.isnan(steps[8]["loss"])
    # The model was found inside the closure, so the fault landed on it.
    [fault] = journal.of_kind("fault_injected")
    assert (fault.step, fault["fault"]) == (4, "nan_grad")
    assert steps[4]["params_finite"] is False and steps[4]["skipped"] is False


@pytest.mark.slow
def test_saves_through_memory_are_journaled_with_the_bytes_of_their_file(
    closure_runs: dict[str, tuple[Journal, str, Path]],
) -> None:
    journal, _, out = closure_runs["none"]
    saves = journal.of_kind("file_saved")
    last = out / "last.pt"
    assert [(e.step, e["path"]) for e in saves] == [(3, str(last)), (6, str(last))]
    # The second save's bytes are the file's as it is now (nothing wrote it since).
    assert saves[-1]["sha256"] == hashlib.sha256(last.read_bytes()).hexdigest()
    assert saves[0]["sha256"] != saves[-1]["sha256"]


@pytest.mark.slow
def test_a_guard_that_drops_every_gradient_skips_the_step(
    closure_runs: dict[str, tuple[Journal, str, Path]],
) -> None:
    steps = closure_runs["none"][0].steps()
    assert steps[4]["skipped"] is True and "grads_repaired" not in steps[4].fields
    assert steps[4]["params_finite"] is True and closure_runs["none"][1] != "final loss nan\n"
    # Negative control: zeroed gradients with momentum still move the weights, an update.
    zeroed = closure_runs["zero"][0].steps()
    assert zeroed[4]["skipped"] is False and zeroed[4]["grads_repaired"] is True


def attempt(run_dir: Path, out: Path, steps: int, restart: int, *, replay: int = 0) -> None:
    """One attempt of a loop that saves every 3 steps and resumes from ``out/last.pt``
    (``replay`` steps before the save's); its fresh optimizer first steps with zero
    gradients and lr 0 to make its state, as DCP's ``get_state_dict`` does."""
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(restart)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with harness.attach(model, optimizer, run_dir=run_dir):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.param_groups[0]["lr"] = 0.0
        optimizer.step()
        optimizer.param_groups[0]["lr"] = 0.1
        optimizer.zero_grad(set_to_none=True)
        start, last = 0, out / "last.pt"
        if last.exists():
            state = torch.load(last)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = int(state["step"]) - replay
        for step in range(start + 1, steps + 1):
            tokens = batch(step)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 3 == 0:
                save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "step": step}, last)  # fmt: skip


@pytest.mark.parametrize("replay", [0, 2])
def test_a_resumed_process_is_numbered_by_its_batch_and_its_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replay: int
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    out = tmp_path / "out"
    out.mkdir()
    attempt(tmp_path / "run", out, 5, 0)
    attempt(tmp_path / "run", out, 8, 1, replay=replay)
    journal = read_journal(tmp_path / "run")
    first = [e for e in journal.of_kind("step") if e.restart == 0]
    second = [e for e in journal.of_kind("step") if e.restart == 1]
    # The state-making step with lr 0 is no step: the first attempt trained steps 1-5.
    assert [e.step for e in first] == [1, 2, 3, 4, 5]
    [loaded] = journal.of_kind("file_loaded")
    assert loaded["saved_step"] == 3 and loaded["intact"] is True
    # Resumed after the save of step 3, or replaying steps 2 and 3 the trainer had done.
    assert [e.step for e in second] == list(range(4 - replay, 9))
    assert second[0]["numbered_by"] == "batch" and "step_conflict" not in second[0].fields
    assert second[0]["batch_fingerprint"] == first[3 - replay]["batch_fingerprint"]
    if not replay:  # the same batch on the same weights: the same loss, bit for bit
        assert second[0]["loss"] == first[3]["loss"]


def test_numbering_prefers_agreeing_evidence_and_says_when_it_disagrees() -> None:
    assert number(20, []).fields() == {"numbered_by": "save"}
    assert (number(20, [21]).done, number(20, [21]).numbered_by) == (20, "batch")
    # A replayed epoch: its first batch was trained at step 17 (and, unshuffled, at 1).
    assert number(20, [1, 17]).done == 16
    # Trained at 33 only: after what the save holds, so one of the two is wrong.
    conflict = number(20, [33])
    assert conflict.done == 20 and conflict.conflict == {"batch_step": 33, "saved_step": 20}


class _Refused(BaseException):
    """A failure that, like DCP's CheckpointException, is no Exception."""


def test_a_load_that_raises_a_base_exception_is_journaled(tmp_path: Path) -> None:
    model = Net()
    path = tmp_path / "weights.pt"
    torch.save(model.state_dict(), path)

    def refuse(*args: object, **kwargs: object) -> None:
        raise _Refused("no")

    with harness.attach(model, None, run_dir=tmp_path / "run"):
        import harness.inside.files as files

        load = files._wrap_load(refuse, "test.load")
        with pytest.raises(_Refused):
            load(path)
    [failed] = read_journal(tmp_path / "run").of_kind("file_load_failed")
    assert failed["path"] == str(path) and failed["error"] == "_Refused: no"


def test_a_fault_after_a_folder_save_damages_the_matching_file_in_it(tmp_path: Path) -> None:
    folder = tmp_path / "step-4"
    folder.mkdir()
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
        (folder / name).write_bytes(bytes(64))
    spec = BitflipFileSpec(path="step-*/__1_0.distcp", after_save=True, at_step=1, seed=1)
    ctx = StepContext(step=4, rank=0, world_size=1, cwd=str(tmp_path))
    [record] = build_injector(spec).on_file_saved(ctx, str(folder))
    assert record.target == str(folder / "__1_0.distcp")
    assert (folder / "__1_0.distcp").read_bytes() != bytes(64)
    assert (folder / "__0_0.distcp").read_bytes() == bytes(64)  # the others untouched
    assert build_injector(spec).on_file_saved(ctx, str(tmp_path / "missing")) == []


def test_an_in_memory_save_written_by_fsspec_is_journaled(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    target = tmp_path / "epoch=0-step=1.ckpt"
    with harness.attach(model, optimizer, run_dir=tmp_path / "run"):
        for step in (1, 2):
            tokens = batch(step)
            model(tokens).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == 1:  # Lightning's _atomic_save: a buffer, then an fsspec transaction
                buffer = io.BytesIO()
                torch.save(model.state_dict(), buffer)
                fs, path = fsspec.core.url_to_fs(str(target))
                with fs.transaction, fs.open(path, "wb") as f:
                    f.write(buffer.getvalue())
    [saved] = read_journal(tmp_path / "run").of_kind("file_saved")
    assert (saved.step, saved["path"]) == (1, str(target))
    assert saved["sha256"] == hashlib.sha256(target.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_program_that_imports_the_attach_module_before_torch_runs_under_exec(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from harness.inside.attach import attach  # imports torch, which starts exec's hooks\n"
        "import torch\n"
        "m = torch.nn.Linear(2, 1)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "m(torch.ones(1, 2)).sum().backward()\n"
        "o.step()\n"
    )
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "harness", "exec", "--run-dir", str(run_dir), "--"]
    # Afresh (never forked warm): the order of the program's own imports is what is tested.
    done = subprocess.run([*command, sys.executable, str(script)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(read_journal(run_dir).steps()) == [1]
