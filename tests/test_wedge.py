"""The hang monitor's look at stalled ranks (reference_trainer/processes/wedge.py): a rank
whose thread holds the GIL (the `gil_lock` fault, for real, in a child process) is busy,
a SIGSTOPped one is stopped, a sleeping one (a rank waiting in a collective) is waiting,
and only the first two are named; the hang monitor blames the wedged rank."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.records.events import Detected, RankBlamed, RankLost
from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from reference_trainer.processes.wedge import classify, culprits

ROOT = Path(__file__).resolve().parent.parent
HOLD = """
from faults.injector import StepContext
from faults.gil import GilLockInjector, GilLockSpec
print("ready", flush=True)
ctx = StepContext(step=1, rank=0, world_size=1, record_now=lambda records: None)
GilLockInjector(GilLockSpec(at_step=1, seconds=30)).before_forward(ctx)
"""
SLEEP = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


@pytest.fixture
def children() -> Iterator[dict[str, subprocess.Popen[str]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
        )
        for name, code in (("wedged", HOLD), ("stopped", SLEEP), ("waiting", SLEEP))
    }
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(timeout=10)
            assert proc.stdout is not None
            proc.stdout.close()


def test_the_rank_holding_the_gil_is_busy_the_stopped_one_stopped_the_sleeper_waiting(
    children: dict[str, subprocess.Popen[str]],
) -> None:
    os.kill(children["stopped"].pid, signal.SIGSTOP)
    host = socket.gethostname()
    ranks = {"wedged": 1, "stopped": 2, "waiting": 0}
    beats = {ranks[n]: {"pid": p.pid, "host": host} for n, p in children.items()}
    beats[3] = {"pid": children["waiting"].pid, "host": "elsewhere"}  # not looked at
    found = classify(beats, window=1.0)
    assert {r: f["state"] for r, f in found.items()} == {1: "busy", 2: "stopped", 0: "waiting"}
    assert found[1]["running"] >= 0.6 and found[0]["running"] < 0.6
    assert culprits(found) == [1, 2]


def test_nobody_is_named_when_every_rank_is_waiting(
    children: dict[str, subprocess.Popen[str]],
) -> None:
    beats = {0: {"pid": children["waiting"].pid, "host": socket.gethostname()}}
    assert culprits(classify(beats)) == []
    assert classify({0: {"pid": 2**22 + 12345, "host": socket.gethostname()}}) == {}


def beat(run_dir: Path, rank: int, pid: int, age: float) -> None:
    path = RunLayout(run_dir).heartbeat_file(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"step": 14, "wall": time.time() - age, "mono": time.monotonic() - age}
    record |= {"timeout": 1.0, "pid": pid}
    path.write_text(json.dumps(record | {"host": socket.gethostname(), "restart": 0}))


def test_the_hang_monitor_blames_the_wedged_rank_not_the_stalest(
    tmp_path: Path, children: dict[str, subprocess.Popen[str]]
) -> None:
    # Both ranks stopped at step 14; the waiting rank 0 beat last, longest ago, so the
    # laggard rule alone (`behind`) would name rank 0: the look at the processes names 1.
    wedged, waiting = children["wedged"], children["waiting"]
    beat(tmp_path, 0, waiting.pid, age=5.0)
    beat(tmp_path, 1, wedged.pid, age=2.0)
    argv = [sys.executable, "-m", "reference_trainer.processes.hang_monitor"]
    argv += ["--run-dir", str(tmp_path), "--rank", "1", "--world-size", "2"]
    argv += ["--pid", str(wedged.pid), "--poll", "0.05"]
    assert subprocess.run(argv, timeout=60, check=False).returncode == 1
    assert wedged.wait(timeout=10) == -signal.SIGKILL and waiting.poll() is None
    journal = read_journal(tmp_path)
    watchdog, wedge = journal.of_kind(Detected)
    assert watchdog["detector"] == "hang_watchdog" and watchdog["details"]["lost_ranks"] == [1]
    assert watchdog["details"]["processes"]["0"]["state"] == "waiting"
    assert wedge["detector"] == "wedged_rank" and wedge["details"]["rank"] == 1
    (blamed,) = journal.of_kind(RankBlamed)
    assert (blamed["blamed_rank"], blamed["detector"]) == (1, "wedged_rank")
    (lost,) = journal.of_kind(RankLost)
    assert lost["lost_rank"] == 1
