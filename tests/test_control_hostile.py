"""Live control under attack: files written into ``control/`` around its signature arm
nothing, end nothing, and each is journaled with the reason it was refused."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.inside.agent import Agent
from harness.inside.live_inbox import LiveInbox
from harness.live.control import (
    MAX_IN_STEPS,
    ensure_secret,
    mac,
    read_secret,
    send,
    signed,
)
from harness.live.control_board import ControlChannel
from harness.records.journal import JournalWriter, read_journal
from harness.run_layout import RunLayout


def finishes(call: Callable[[], Any], seconds: float = 10.0) -> Any:
    """``call()``'s result; fails the test when it blocks past ``seconds`` (a FIFO read)."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still blocked after {seconds} s"
    return out[0]


def train(
    run_dir: Path, steps: int, before: Callable[[int], None] = lambda step: None
) -> list[int]:
    """A one-rank attached loop of ``steps`` steps; the steps whose gradient was NaN."""
    model = torch.nn.Linear(4, 2)
    agent = Agent(run_dir, model=model, optimizer=torch.optim.SGD(model.parameters(), 0.1))
    agent.start(0)
    nan_steps = []
    for step in range(1, steps + 1):
        before(step)
        agent.begin_step(step)
        model(torch.ones(1, 4)).sum().backward()
        agent.after_backward()
        if model.weight.grad is not None and model.weight.grad.isnan().any():
            nan_steps.append(step)
        model.zero_grad()
        agent.end_step()
    agent.close("completed")
    return nan_steps


def refusals(run_dir: Path) -> dict[str, str]:
    """Refused commands by id, as the journal has them."""
    return {
        e["id"]: e.get("reason", "")
        for e in read_journal(run_dir).of_kind("command")
        if not e["accepted"]
    }


def armed_body(**over: Any) -> dict[str, Any]:
    """An armed entry's body, as rank 0 writes it, for step 3 unless ``over`` says."""
    body = {
        "id": "evil",
        "fault": {"kind": "nan_grad", "target": "weight"},
        "step": 3,
        "attempt": 0,
        "expires": time.time() + 600,
    }
    return {**body, **over}


def test_a_hand_written_armed_entry_is_not_armed(tmp_path: Path) -> None:
    armed = RunLayout(tmp_path).control / "armed"

    def attack(step: int) -> None:
        if step == 1:  # the job made control/ at start; the forger writes into it now
            raw = {"id": "evil", "fault": {"kind": "nan_grad"}, "step": 4, "attempt": 0}
            (armed / "000000.json").write_text(json.dumps(raw))
            forged = {"armed": armed_body(step=5), "mac": "0" * 64}  # the new shape, no secret
            (armed / "000001.json").write_text(json.dumps(forged))
            send(tmp_path, {"kind": "nan_grad", "target": "weight"}, in_steps=2)

    assert train(tmp_path, 7, attack) == [3]  # the signed command only
    refused = refusals(tmp_path)
    assert "unreadable armed entry" in refused["armed/000000.json"]
    assert "authentication failed" in refused["armed/000001.json"]


def test_a_malformed_armed_entry_ends_nothing(tmp_path: Path) -> None:
    def attack(step: int) -> None:
        if step == 1:
            (RunLayout(tmp_path).control / "armed" / "000000.json").write_text('{"attempt": 0}')
            send(tmp_path, {"kind": "nan_grad", "target": "weight"}, in_steps=1)

    assert train(tmp_path, 4, attack) == [2]
    assert "KeyError" in refusals(tmp_path)["armed/000000.json"]
    (end,) = read_journal(tmp_path).of_kind("run_end")
    assert end["status"] == "completed"


@pytest.mark.parametrize("where", ["inbox", "armed"])
@pytest.mark.parametrize("hostile", ["fifo", "dev_zero"])
def test_fifos_and_links_are_refused_without_reading(
    tmp_path: Path, where: str, hostile: str
) -> None:
    ensure_secret(tmp_path)
    path = RunLayout(tmp_path).control / where / "000000.json"
    if hostile == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    # Rank 1 of two reads the board at every step; rank 0 alone reads the inbox.
    rank = 0 if where == "inbox" else 1
    with JournalWriter(tmp_path, rank=rank) as journal:
        inbox = LiveInbox(tmp_path, rank=rank, world_size=2, restart=0)
        assert finishes(lambda: inbox.take(1, journal)) == []
    (event,) = read_journal(tmp_path).of_kind("command")
    assert event["accepted"] is False
    why = "a symbolic link" if hostile == "dev_zero" else "not a regular file (a FIFO)"
    assert why in event["reason"]


def _signed_command(run_dir: Path, name: str, body: dict[str, Any]) -> None:
    message = signed(read_secret(run_dir), "command", {"issued": time.time(), **body})
    (RunLayout(run_dir).control / "inbox" / f"{name}.json").write_text(json.dumps(message))


def test_signed_commands_the_job_cannot_have_are_refused(tmp_path: Path) -> None:
    channel = ControlChannel(tmp_path, world_size=1)
    fault = {"kind": "nan_grad"}
    _signed_command(tmp_path, "far", {"id": "far", "fault": fault, "in_steps": 10**12})
    _signed_command(
        tmp_path, "rank7", {"id": "rank7", "fault": {**fault, "ranks": [7]}, "in_steps": 1}
    )
    _signed_command(tmp_path, "list", {"id": "list", "fault": [1], "in_steps": 1})
    received = {r.id: r for r in channel.poll()}
    assert all(r.fault is None for r in received.values())
    assert f"from 0 to {MAX_IN_STEPS}, got 1000000000000" in received["far"].reason
    assert "ranks [7] are not ranks of this job (ranks 0 to 0)" in received["rank7"].reason
    assert "must be a mapping" in received["list"].reason


def test_the_agent_refuses_a_rank_it_lacks_and_keeps_training(tmp_path: Path) -> None:
    def attack(step: int) -> None:
        if step == 1:
            send(tmp_path, {"kind": "nan_grad", "ranks": [7]}, in_steps=1)

    assert train(tmp_path, 3, attack) == []
    (reason,) = refusals(tmp_path).values()
    assert "ranks [7] are not ranks of this job" in reason


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"step": 10**12}, f"step must be a whole number from 1 to {1 + MAX_IN_STEPS + 1}"),
        ({"fault": {"kind": "nan_grad", "ranks": [7]}}, "ranks [7] are not ranks of this job"),
        ({"expires": time.time() - 1}, "expired"),
        ({"expires": None}, "carries no expiry"),
        ({"fault": {"kind": "nan_grad", "at_step": 2}}, "drop at_step"),
    ],
)
def test_signed_armed_entries_are_checked_by_every_rank(
    tmp_path: Path, over: dict[str, Any], why: str
) -> None:
    key = ensure_secret(tmp_path)
    body = armed_body(**over)
    message = {"armed": body, "mac": mac(key, body)}
    (RunLayout(tmp_path).control / "armed" / "000000.json").write_text(json.dumps(message))
    with JournalWriter(tmp_path, rank=1) as journal:
        assert LiveInbox(tmp_path, rank=1, world_size=2, restart=0).take(1, journal) == []
    assert why in refusals(tmp_path)["evil"]


def test_a_signed_armed_entry_is_taken_once(tmp_path: Path) -> None:
    key = ensure_secret(tmp_path)
    armed = RunLayout(tmp_path).control / "armed"
    body = armed_body()
    (armed / "000000.json").write_text(json.dumps({"armed": body, "mac": mac(key, body)}))
    with JournalWriter(tmp_path, rank=1) as journal:
        inbox = LiveInbox(tmp_path, rank=1, world_size=2, restart=0)
        (spec,) = inbox.take(1, journal)
        assert (spec.kind, spec.at_step) == ("nan_grad", 3)
        (armed / "000001.json").write_bytes((armed / "000000.json").read_bytes())  # a copy
        time.sleep(0.01)
        assert inbox.take(2, journal) == []
    assert "replayed" in refusals(tmp_path)["evil"]


def test_a_broken_channel_is_journaled_once_and_training_goes_on(tmp_path: Path) -> None:
    def attack(step: int) -> None:
        if step == 1:
            acks = RunLayout(tmp_path).control / "acks"
            acks.rmdir()
            acks.write_text("")  # the job's answers cannot be written now
            send(tmp_path, {"kind": "nan_grad", "target": "weight"}, in_steps=1)
            send(tmp_path, {"kind": "nan_grad", "target": "weight"}, in_steps=1)

    train(tmp_path, 4, attack)
    events = read_journal(tmp_path)
    failed = [e for e in events.of_kind("command") if e["id"] == "control"]
    assert len(failed) == 1 and "NotADirectoryError" in failed[0]["reason"]
    assert events.of_kind("run_end")[0]["status"] == "completed"


def test_what_rank_0_arms_every_rank_takes(tmp_path: Path) -> None:
    with JournalWriter(tmp_path, rank=0) as j0, JournalWriter(tmp_path, rank=1) as j1:
        rank0 = LiveInbox(tmp_path, rank=0, world_size=2, restart=0)
        rank1 = LiveInbox(tmp_path, rank=1, world_size=2, restart=0)
        send(tmp_path, {"kind": "nan_grad", "ranks": [1]}, in_steps=3)
        (on0,) = rank0.take(5, j0)
        (on1,) = rank1.take(5, j1)
    assert on0 == on1 and (on0.kind, on0.at_step, on0.ranks) == ("nan_grad", 8, [1])
    assert not refusals(tmp_path)
