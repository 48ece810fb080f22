"""The agent's bookkeeping: when faults fire, and that a fault happens at a step once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from faults import FaultPlan, FaultSpecError
from faults.data import ContaminatedStream
from harness.inside.agent import Agent
from harness.records.journal import read_journal

ROOT = Path(__file__).resolve().parent.parent


def _agent(run_dir: Path, faults: list[dict[str, object]]) -> tuple[Agent, torch.nn.Linear]:
    model = torch.nn.Linear(4, 2)
    plan = FaultPlan.from_dict({"faults": faults})
    agent = Agent(run_dir, plan=plan, model=model, control=False)
    agent.start(0)
    return agent, model


def _train(agent: Agent, model: torch.nn.Linear, steps: range) -> list[int]:
    """Steps whose gradients came out NaN."""
    hit = []
    for step in steps:
        agent.begin_step(step)
        model(torch.ones(1, 4)).sum().backward()
        agent.after_backward()
        if model.weight.grad is not None and model.weight.grad.isnan().any():
            hit.append(step)
        model.zero_grad()
        agent.end_step()
    return hit


def test_a_replayed_step_does_not_meet_its_fault_again(tmp_path: Path) -> None:
    agent, model = _agent(tmp_path, [{"kind": "nan_grad", "at_step": 3, "duration": 2}])
    assert _train(agent, model, range(1, 6)) == [3, 4]
    assert _train(agent, model, range(2, 6)) == []  # rolled back to 1 and replayed
    agent.close("completed")


def test_a_restarted_job_remembers_what_fired_from_its_journal(tmp_path: Path) -> None:
    faults = [{"kind": "nan_grad", "at_step": 3}, {"kind": "nan_grad", "at_step": 5}]
    agent, model = _agent(tmp_path, faults)
    assert _train(agent, model, range(1, 4)) == [3]
    agent.close("failed", "killed")  # the job dies after step 3 ...
    again, model = _agent(tmp_path, faults)  # ... and restarts from a checkpoint at 1
    assert _train(again, model, range(2, 7)) == [5]
    again.close("completed")
    fired = [
        (e.step, e["details"]["plan_index"])
        for e in read_journal(tmp_path).of_kind("fault_injected")
    ]
    assert fired == [(3, 0), (5, 1)]


def test_a_time_triggered_fault_fires_at_the_first_step_after_its_deadline(tmp_path: Path) -> None:
    agent, model = _agent(
        tmp_path,
        [{"kind": "nan_grad", "after_seconds": 0.0, "duration": 2},
         {"kind": "nan_grad", "after_seconds": 3600.0}],
    )  # fmt: skip
    assert _train(agent, model, range(1, 6)) == [1, 2]
    agent.close("completed")


def test_bad_batch_injections_carry_their_plan_index(tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path, [{"kind": "bad_batch", "at_step": 2, "vocab_size": 10}])
    for step in (1, 2, 3):
        agent.begin_step(step)
        agent.batch(torch.zeros(4, 8, dtype=torch.int64))
        agent.end_step()
    agent.close("completed")
    (event,) = read_journal(tmp_path).of_kind("fault_injected")
    assert event.step == 2 and event["details"]["plan_index"] == 0


@dataclass(frozen=True)
class Doc:
    index: int
    source: str
    text: str


def test_a_document_stream_fault_wraps_the_stream_through_its_injector(tmp_path: Path) -> None:
    fault = {"kind": "duplicate_contamination", "at_step": 1, "rate": 0.05, "ranks": [1]}
    agent, _ = _agent(tmp_path, [{"kind": "nan_grad", "at_step": 3}, fault])
    wrap = agent.document_wrapper()
    assert wrap is not None  # on rank 0 too: the stream is every rank's
    docs = [Doc(i, "web", f"document number {i} says something") for i in range(400)]
    stream = wrap(iter(docs))
    assert isinstance(stream, ContaminatedStream)
    assert [d.text for d in stream] == [d.text for d in ContaminatedStream(stream.spec, docs)]
    agent.close("completed")


def test_no_stream_fault_no_wrapper_and_two_are_refused(tmp_path: Path) -> None:
    plain, _ = _agent(tmp_path / "a", [{"kind": "nan_grad", "at_step": 3}])
    assert plain.document_wrapper() is None
    fault = {"kind": "duplicate_contamination", "at_step": 1, "rate": 0.05}
    two, _ = _agent(tmp_path / "b", [fault, fault])
    with pytest.raises(FaultSpecError, match="one duplicate_contamination fault, not several"):
        two.document_wrapper()


SELF_KILL = """
import sys
from faults import FaultPlan
from harness.inside.agent import Agent
from harness.records.events import StepObserved
plan = FaultPlan.from_dict({"faults": [{"kind": "kill", "at_step": 2}]})
agent = Agent(sys.argv[1], plan=plan, control=False)
agent.start(0)
for step in (1, 2, 3):
    agent.begin_step(step)
    agent.observe_step(StepObserved(loss=1.0))
    agent.end_step()
print("survived")
"""


def test_a_fault_that_kills_its_own_process_is_journaled_first(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", SELF_KILL, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "survived" not in proc.stdout
    (event,) = read_journal(tmp_path).of_kind("fault_injected")
    assert (event.step, event["fault"], event["details"]["plan_index"]) == (2, "kill", 0)
    assert (event["details"]["rank"], event["details"]["signal"]) == (0, "SIGKILL")


def test_params_finite_tells_nan_and_inf_from_huge_finite_weights() -> None:
    from harness.inside.step_evidence import params_finite

    model = torch.nn.Linear(4, 4)
    assert params_finite(model)
    with torch.no_grad():
        model.weight[0, 0] = 3e38  # finite, yet its norm overflows: the exact look decides
    assert params_finite(model)
    for bad in (float("nan"), float("inf"), float("-inf")):
        with torch.no_grad():
            model.weight[1, 1] = bad
        assert not params_finite(model)
