"""Live control: authenticated, validated commands armed on every rank for the same step."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from faults import FaultSpecError
from harness.commands.main import main as tightrope
from harness.inside.agent import Agent
from harness.live.control import (
    Answer,
    ControlError,
    ensure_secret,
    read_secret,
    registered_pids,
    send,
    wait_for_answer,
)
from harness.live.control_board import ControlChannel
from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from harness.running import warm_start

from .conftest import ROOT


def test_the_secret_is_private_and_reused(tmp_path: Path) -> None:
    key = ensure_secret(tmp_path)
    path = RunLayout(tmp_path).control / "secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) == 64
    assert ensure_secret(tmp_path) == key
    os.chmod(path, 0o644)
    with pytest.raises(ControlError, match="readable by others"):
        read_secret(tmp_path)


def test_a_run_without_channel_is_named(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="has no control channel"):
        send(tmp_path, {"kind": "nan_grad"})


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"kind": "nan_gradd"}, "unknown fault kind 'nan_gradd'"),
        ({"kind": "nan_grad", "fraction": 7}, "command.fraction"),
        ({"kind": "nan_grad", "at_step": 3}, "drop at_step"),
        (
            {"kind": "duplicate_contamination", "rate": 0.05},
            "cannot be injected live: it acts on the doc",
        ),
        (
            {"kind": "tokenizer_stress", "rate": 0.05},
            "cannot be injected live: it acts on the doc",
        ),
        ({"kind": "node_kill", "node": 1}, "cannot be injected live: it acts on a Docker"),
        ({"kind": "bitflip_file", "file": "../../../x/*"}, "must stay inside"),
    ],
)
def test_bad_commands_are_refused_before_sending(
    tmp_path: Path, fault: dict[str, object], message: str
) -> None:
    ensure_secret(tmp_path)
    with pytest.raises(FaultSpecError, match=message):
        send(tmp_path, fault)
    assert not list((RunLayout(tmp_path).control / "inbox").iterdir())


def test_forged_and_tampered_commands_are_rejected(tmp_path: Path) -> None:
    channel = ControlChannel(tmp_path)
    good = send(tmp_path, {"kind": "nan_grad"})
    inbox = RunLayout(tmp_path).control / "inbox"
    message = json.loads((inbox / f"{good.id}.json").read_text())
    message["command"]["fault"]["fraction"] = 0.5  # changed after signing
    (inbox / f"{good.id}.json").write_text(json.dumps(message))
    (inbox / "forged.json").write_text(json.dumps({"command": {"id": "x"}, "mac": "00"}))
    received = {r.id: r for r in channel.poll()}
    assert received[good.id].fault is None
    assert "authentication failed" in received[good.id].reason
    assert "authentication failed" in received["x"].reason
    assert not list(inbox.iterdir())  # read once, never again


def test_an_unanswered_command_is_withdrawn(tmp_path: Path) -> None:
    ensure_secret(tmp_path)
    command = send(tmp_path, {"kind": "nan_grad"})
    assert wait_for_answer(tmp_path, command.id, timeout=0.2) is None
    assert not (RunLayout(tmp_path).control / "inbox" / f"{command.id}.json").exists()


def test_the_agent_arms_a_command_for_the_asked_step(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    agent = Agent(tmp_path, model=model, optimizer=torch.optim.SGD(model.parameters(), 0.1))
    agent.start(0)
    assert registered_pids(tmp_path) == {0: os.getpid()}
    command = send(tmp_path, {"kind": "nan_grad", "target": "weight"}, in_steps=2)
    nan_steps = []
    for step in range(1, 7):
        agent.begin_step(step)
        model(torch.ones(1, 4)).sum().backward()
        agent.after_backward()
        if model.weight.grad is not None and model.weight.grad.isnan().any():
            nan_steps.append(step)
        model.zero_grad()
        agent.end_step()
    agent.close("completed")
    answer = wait_for_answer(tmp_path, command.id, timeout=1)
    assert answer == Answer(command.id, step=1, accepted=True, effective_step=3)
    assert nan_steps == [3]
    (event,) = read_journal(tmp_path).of_kind("command")
    assert event["effective_step"] == 3 and event.step == 1


@pytest.mark.slow
@pytest.mark.distributed
def test_live_injection_into_a_running_two_rank_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The job starts as the suite's other trainer processes do (forked warm, when the session
    # is); ``tightrope inject`` runs in this process, so it lands within a step or two of the
    # fifth, and 100 steps leave the job running long after the step it is armed for.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", "-m", "reference_trainer", "--preset", "tiny", "--steps", "100",
            "--log-every", "1000", "--run-dir", str(tmp_path)]  # fmt: skip
    job = subprocess.Popen(
        warm_start.warm(argv, env), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        journal = tmp_path / "journal" / "rank-1.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if journal.exists() and journal.read_text().count('"kind":"step"') >= 5:
                break
            time.sleep(0.05)
        capsys.readouterr()
        code = tightrope(
            ["inject", str(tmp_path), "nan_grad", "--rank", "1", "--in-steps", "3",
             "target=blocks.0.*"]
        )  # fmt: skip
        printed = capsys.readouterr()
        assert code == 0, printed.err
        effective = int(printed.out.split("armed for step ")[1].split()[0])
        at = int(printed.out.split("the job was at step ")[1].rstrip(")\n"))
        assert effective == at + 3
        job.wait(timeout=300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, job.stderr.read() if job.stderr else ""
    events = read_journal(tmp_path)
    (fired,) = events.of_kind("fault_injected")
    assert (fired.rank, fired.step) == (1, effective)
    assert {e.rank for e in events.of_kind("command")} == {0, 1}
    # It took effect on both ranks at that step (the NaN reaches rank 0 through the
    # all-reduce): both repaired that block's gradient by surgery, rather than skipping.
    for rank in (0, 1):
        operated = [
            e.step
            for e in events.of_kind("recovered")
            if e.rank == rank and e["action"] == "gradient_surgery"
        ]
        assert operated[:1] == [effective], (rank, operated)
        assert events.steps(rank)[effective - 1]["skipped"] is False
    assert events.steps(1)[effective].get("grads_repaired") is True  # the agent saw it


def test_a_replayed_or_stale_command_is_refused(tmp_path: Path) -> None:
    channel = ControlChannel(tmp_path)
    inbox = RunLayout(tmp_path).control / "inbox"
    sent = send(tmp_path, {"kind": "nan_grad"})
    copy = (inbox / f"{sent.id}.json").read_text()
    [first] = channel.poll()
    assert first.fault is not None
    (inbox / "again.json").write_text(copy)  # the same signed bytes, dropped in again
    time.sleep(0.01)
    [again] = channel.poll()
    assert again.fault is None and again.reason.startswith("replayed")
    old = send(tmp_path, {"kind": "nan_grad"})
    path = inbox / f"{old.id}.json"
    message = json.loads(path.read_text())
    key = read_secret(tmp_path)
    from harness.live.control import mac

    message["command"]["issued"] -= 3600  # an hour old, signed as such
    message["mac"] = mac(key, message["command"])
    path.write_text(json.dumps(message))
    [stale] = channel.poll()
    assert stale.fault is None and stale.reason.startswith("expired")


def test_nothing_in_the_inbox_ends_the_job(tmp_path: Path) -> None:
    channel = ControlChannel(tmp_path)
    inbox = RunLayout(tmp_path).control / "inbox"
    (inbox / "folder.json").mkdir()
    (inbox / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (inbox / "big.json").write_bytes(b" " * 200_000)
    (inbox / "latin1.json").write_bytes(b"\xff\xfe")
    received = channel.poll()
    assert len(received) == 4 and all(r.fault is None for r in received)
    assert not list(inbox.iterdir())


def test_inject_parameters_that_are_no_yaml_scalar_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ensure_secret(tmp_path)
    # Not YAML: taken as the text it is, which a fraction is not.
    code = tightrope(["inject", str(tmp_path), "nan_grad", "fraction=!!python/object:os.system"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "tightrope: error:" in err[0]
    assert not list((RunLayout(tmp_path).control / "inbox").iterdir())
