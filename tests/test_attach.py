"""The agent attached to a trainer that knows nothing of tightrope: in-process and by exec."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import harness
from faults import FaultPlan
from harness.commands.main import main as tightrope
from harness.records.journal import Journal, read_journal
from harness.running import warm_start

from .plain_train import VOCAB, Net

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "tests/plain_train.py"
NAN_AT_5 = "faults:\n  - kind: nan_grad\n    at_step: 5\n    target: 'blocks.0.*'\n"


def batches(n: int) -> Iterator[torch.Tensor]:
    """``n`` seeded batches of 8 sequences of 13 tokens."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(n):
        yield (torch.randint(0, VOCAB, (8, 1), generator=gen) + torch.arange(13)) % VOCAB


def train(run_dir: Path, plan: FaultPlan | None, steps: int = 5) -> tuple[list[float], int]:
    """A plain loop with the agent attached in three lines; (losses, agent's step count)."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    with harness.attach(model, optimizer, run_dir=run_dir, plan=plan) as agent:
        for tokens in agent.wrap_batches(batches(steps)):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, agent.step


def same(a: float, b: float) -> bool:
    """Equal, NaN included."""
    return a == b or (math.isnan(a) and math.isnan(b))


def test_explicit_attach_journals_an_injected_nan_grad(tmp_path: Path) -> None:
    original = torch.Tensor.backward
    plan = FaultPlan.from_dict({"faults": [{"kind": "nan_grad", "at_step": 3, "target": "*"}]})
    losses, steps = train(tmp_path, plan)
    assert torch.Tensor.backward is original  # restored on close
    journal = read_journal(tmp_path)
    [fault] = journal.of_kind("fault_injected")
    assert (fault.step, fault["fault"], fault["target"]) == (3, "nan_grad", "*")
    by_step = journal.steps()
    assert steps == 5 and sorted(by_step) == [1, 2, 3, 4, 5]
    assert math.isnan(by_step[3]["grad_norm"]) and by_step[3]["params_finite"] is False
    assert all(same(by_step[s]["loss"], losses[s - 1]) for s in by_step)
    # The gradient norm is measured on checked steps (every 10th, and injected ones).
    assert by_step[2]["grad_norm"] is None and by_step[2]["lr"] == 1e-2
    [end] = journal.of_kind("run_end")
    assert (end.step, end["status"]) == (5, "completed")


def test_explicit_attach_without_a_plan_only_observes(tmp_path: Path) -> None:
    losses, _ = train(tmp_path, None, steps=10)
    journal = read_journal(tmp_path)
    assert not journal.of_kind("fault_injected")
    assert journal.losses() == losses
    # Checked every 50 steps (none in 10) and once more at the end.
    assert not any("params_finite" in e.fields for e in journal.steps().values())
    assert journal.of_kind("run_end")[0]["params_finite"] is True


def test_wrap_batches_feeds_bad_data_faults(tmp_path: Path) -> None:
    plan = FaultPlan.from_dict({"faults": [{"kind": "bad_batch", "at_step": 2, "fraction": 0.5}]})
    train(tmp_path, plan, steps=3)
    [fault] = read_journal(tmp_path).of_kind("fault_injected")
    assert (fault.step, fault["fault"], len(fault["details"]["rows"])) == (2, "bad_batch", 4)


def test_an_exception_ends_the_run_as_failed(tmp_path: Path) -> None:
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError), harness.attach(model, optimizer, run_dir=tmp_path):
        model(next(batches(1))).sum().backward()
        optimizer.step()
        raise RuntimeError("trainer crashed")
    [end] = read_journal(tmp_path).of_kind("run_end")
    assert (end.step, end["status"], end["reason"]) == (
        1,
        "failed",
        "RuntimeError: trainer crashed",
    )


# -- tightrope exec ------------------------------------------------------------------------


def launch(*args: str) -> subprocess.Popen[str]:
    """Start a command in the repository root with one thread per process (forked warm when
    the test session is: tests/conftest.py)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = warm_start.warm(list(args), env)
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Exit code and stdout (stderr goes to the assertion message when the code is not 0)."""
    out, err = proc.communicate(timeout=240)
    assert proc.returncode in (0, 3), err
    return proc.returncode, out


def exec_cmd(run_dir: Path, plan: Path | None) -> list[str]:
    """``tightrope exec`` with this interpreter."""
    planned = ["--plan", str(plan)] if plan is not None else []
    return [sys.executable, "-m", "harness", "exec", "--run-dir", str(run_dir), *planned, "--"]


@pytest.fixture(scope="module")
def exec_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int, str]]:
    """The plain script run three ways at once: attached with a plan (and told to exit 3),
    attached without one, alone. Name -> (run dir, exit code, stdout)."""
    root = tmp_path_factory.mktemp("exec")
    plan = root / "plan.yaml"
    plan.write_text(NAN_AT_5)
    script = [sys.executable, SCRIPT, "--steps", "8"]
    exit3 = ["--exit-code", "3"]
    procs = {
        "faulted": (root / "faulted", launch(*exec_cmd(root / "faulted", plan), *script, *exit3)),
        "clean": (root / "clean", launch(*exec_cmd(root / "clean", None), *script)),
        "alone": (root / "alone", launch(*script)),
    }
    return {name: (run_dir, *finish(proc)) for name, (run_dir, proc) in procs.items()}


@pytest.mark.slow
def test_exec_lands_the_fault_at_its_step(exec_runs: dict[str, tuple[Path, int, str]]) -> None:
    run_dir, code, out = exec_runs["faulted"]
    journal = read_journal(run_dir)
    [fault] = journal.of_kind("fault_injected")
    assert (fault.step, fault["target"]) == (5, "blocks.0.*")
    by_step = journal.steps()
    assert sorted(by_step) == list(range(1, 9))
    assert math.isnan(by_step[5]["grad_norm"]) and by_step[5]["params_finite"] is False
    assert all(by_step[s].get("params_finite") is not False for s in range(1, 5))
    assert all(math.isfinite(by_step[s]["loss"]) for s in range(1, 6))
    assert code == 3 and out.strip() == "final loss nan"  # the script's own exit code
    [end] = journal.of_kind("run_end")
    assert (end["status"], end["reason"]) == ("failed", "SystemExit: 3")


@pytest.mark.slow
def test_exec_without_a_plan_is_transparent(exec_runs: dict[str, tuple[Path, int, str]]) -> None:
    run_dir, code, out = exec_runs["clean"]
    journal = read_journal(run_dir)
    assert not journal.of_kind("fault_injected")
    assert sorted(journal.steps()) == list(range(1, 9))
    assert all(math.isfinite(loss) for loss in journal.losses())
    assert code == 0 and out == exec_runs["alone"][2] and out.startswith("final loss ")
    assert float(out.split()[-1]) == journal.losses()[-1]


def check_journals(journal: Journal) -> None:
    """Both ranks journal 4 steps; the rank-1 fault is injected on rank 1 only, during
    backward, so DDP's all-reduce carries the NaN to rank 0 in the same step."""
    assert journal.ranks == [0, 1]
    assert all(sorted(journal.steps(rank)) == [1, 2, 3, 4] for rank in (0, 1))
    [fault] = journal.of_kind("fault_injected")
    assert (fault.rank, fault.step, fault["details"]["at"]) == (1, 2, "backward")
    assert math.isnan(journal.steps(1)[2]["grad_norm"])
    # Unguarded: both ranks applied the NaN update at step 2 (rank 0 checked at the end).
    ends = {e.rank: e for e in journal.of_kind("run_end")}
    assert ends[0]["params_finite"] is False and ends[1]["params_finite"] is False
    assert math.isfinite(journal.steps(0)[2]["loss"]) and math.isnan(journal.steps(0)[3]["loss"])


@pytest.mark.slow
@pytest.mark.distributed
def test_exec_under_torchrun_hits_the_planned_rank(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - kind: nan_grad\n    at_step: 2\n    ranks: [1]\n")
    torchrun = str(Path(sys.executable).parent / "torchrun")
    launcher = [torchrun, "--standalone", "--nproc-per-node", "2", SCRIPT, "--steps", "4"]
    code, _ = finish(launch(*exec_cmd(tmp_path / "run", plan), *launcher))
    assert code == 0
    check_journals(read_journal(tmp_path / "run"))


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single error line the command printed."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tightrope: error: "), lines
    return lines[0]


def test_exec_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["exec", "--run-dir", str(tmp_path / "run")]
    missing = tmp_path / "missing.yaml"
    assert tightrope([*run, "--plan", str(missing), "--", "python", SCRIPT]) == 2
    assert str(missing) in one_line(capsys)
    assert tightrope([*run, "--"]) == 2
    assert "no command" in one_line(capsys)
    data_fault = tmp_path / "data.yaml"
    data_fault.write_text("faults: [{kind: duplicate_contamination, at_step: 1, rate: 0.01}]")
    assert tightrope([*run, "--plan", str(data_fault), "--", "python", SCRIPT]) == 2
    assert "document stream" in one_line(capsys)
    assert tightrope([*run, "--", "no-such-command-xyz"]) == 2
    assert "not found" in one_line(capsys)
    (tmp_path / "run" / "journal").mkdir(parents=True)
    assert tightrope([*run, "--", sys.executable, SCRIPT]) == 2
    assert "already holds a journal" in one_line(capsys)
