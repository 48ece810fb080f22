"""Process faults send real signals to real child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from faults.errors import FaultSpecError, InjectionError
from faults.injector import StepContext
from faults.proc_stat import state as proc_state
from faults.process import (
    HangInjector,
    HangSpec,
    KillInjector,
    KillSpec,
    PreemptInjector,
    PreemptSpec,
)
from faults.registry import kinds, parse_fault

ROOT = Path(__file__).resolve().parent.parent
SLEEPER = "import time; time.sleep(60)"
READY = "import signal, sys, time\n{setup}\nprint('ready', flush=True)\ntime.sleep(60)\n"

Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start children; every one is killed and reaped at the end, whatever happened."""
    children: list[subprocess.Popen[str]] = []

    def start(code: str = SLEEPER, ready: bool = False) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE if ready else None, text=True
        )
        children.append(proc)
        if ready:  # wait until its signal handlers are installed
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        return proc

    try:
        yield start
    finally:
        for proc in children:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


def state(pid: int) -> str:
    """The process state letter from /proc (R, S, T, Z...), or '-' when gone."""
    try:
        return proc_state(pid)
    except FileNotFoundError:
        return "-"


def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_kill_sends_sigkill(spawn: Spawn) -> None:
    proc = spawn()
    [rec] = KillInjector(KillSpec(at_step=1)).apply({0: proc.pid}, [0])
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert rec.target == "rank 0"
    assert rec.details == {"rank": 0, "pid": proc.pid, "signal": "SIGKILL"}


def test_hang_stops_the_process(spawn: Spawn) -> None:
    proc = spawn()
    HangInjector(HangSpec(at_step=1)).apply({0: proc.pid}, [0])
    assert wait_for(lambda: state(proc.pid) == "T")
    time.sleep(0.3)
    assert state(proc.pid) == "T" and proc.poll() is None


def test_hang_resumes_after_the_delay(spawn: Spawn) -> None:
    proc = spawn()
    [rec] = HangInjector(HangSpec(at_step=1, resume_after=0.5)).apply({0: proc.pid}, [0])
    start = time.monotonic()
    assert wait_for(lambda: state(proc.pid) == "T")
    assert wait_for(lambda: state(proc.pid) in "RS")
    assert time.monotonic() - start >= 0.3
    assert rec.details["resume_after"] == 0.5 and proc.poll() is None


def test_a_hang_resumer_gives_up_once_the_hung_process_is_gone(spawn: Spawn) -> None:
    # The hang watchdog kills a hung rank long before a late resume_after; a resumer that
    # slept on outlived the job (soak seed 7's no_processes_left, issue 28).
    proc = spawn()
    [rec] = HangInjector(HangSpec(at_step=1, resume_after=60)).apply({0: proc.pid}, [0])
    assert wait_for(lambda: state(proc.pid) == "T")
    helper = rec.details["helper_pid"]
    assert state(helper) not in "-Z"
    proc.kill()
    proc.wait()
    assert wait_for(lambda: state(helper) in "-Z")  # ended, not asleep for a minute


def test_preempt_lets_a_clean_exit_happen(spawn: Spawn) -> None:
    code = READY.format(setup="signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))")
    proc = spawn(code, ready=True)
    [rec] = PreemptInjector(PreemptSpec(at_step=1, grace_seconds=5)).apply({0: proc.pid}, [0])
    assert proc.wait(timeout=5) == 0
    assert rec.details["signal"] == "SIGTERM" and rec.details["grace_seconds"] == 5
    helper = rec.details["helper_pid"]  # gives up once the process is gone
    assert wait_for(lambda: state(helper) in "-Z")


def test_preempt_kills_a_process_that_ignores_sigterm(spawn: Spawn) -> None:
    proc = spawn(READY.format(setup="signal.signal(signal.SIGTERM, signal.SIG_IGN)"), ready=True)
    start = time.monotonic()
    PreemptInjector(PreemptSpec(at_step=1, grace_seconds=0.5)).apply({0: proc.pid}, [0])
    time.sleep(0.2)
    assert proc.poll() is None  # still alive within the grace period
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert time.monotonic() - start >= 0.45


@pytest.mark.parametrize(
    "injector", [KillInjector(KillSpec(at_step=1)), HangInjector(HangSpec(at_step=1))]
)
def test_missing_process_sends_nothing(spawn: Spawn, injector: KillInjector | HangInjector) -> None:
    alive = spawn()
    dead = spawn("pass")
    dead.wait(timeout=10)
    with pytest.raises(InjectionError, match=rf"rank 1: process {dead.pid} does not exist"):
        injector.apply({0: alive.pid, 1: dead.pid}, [0, 1])
    with pytest.raises(InjectionError, match="rank 2: no process id"):
        injector.apply({0: alive.pid}, [0, 2])
    time.sleep(0.2)
    assert alive.poll() is None and state(alive.pid) in "RS"


def test_end_step_on_a_rank_signals_only_that_rank_when_targeted(spawn: Spawn) -> None:
    procs = [spawn() for _ in range(3)]
    pids = {r: p.pid for r, p in enumerate(procs)}
    injector = KillInjector(KillSpec(at_step=4, ranks=[1, 2]))
    # Rank 0 is not a target: its agent sends nothing, whatever pids it knows.
    assert injector.end_step(StepContext(step=4, rank=0, world_size=3, pids=pids)) == []
    # Rank 1 is: it signals its own process (here a stand-in child), and no other.
    records = injector.end_step(StepContext(step=4, rank=1, world_size=3, pids=pids))
    assert [r.details["rank"] for r in records] == [1]
    assert procs[1].wait(timeout=5) == -signal.SIGKILL
    time.sleep(0.2)
    assert procs[0].poll() is None and procs[2].poll() is None


SELF_KILL = """
import json, os, subprocess, sys
from faults.process import KillInjector, KillSpec
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
injector = KillInjector(KillSpec(at_step=1, ranks="all"))
def journal(records):
    with open(sys.argv[1], "w") as f:
        json.dump([r.details for r in records], f)
        f.flush()
injector.apply({1: other.pid, 0: os.getpid()}, [0, 1], before_signal=journal)
print("survived")
"""


def test_self_is_signalled_last_after_the_records_are_handed_over(tmp_path: Path) -> None:
    out = tmp_path / "records.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", SELF_KILL, str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, stderr
    assert "survived" not in stdout
    records = json.loads(out.read_text())
    assert [r["rank"] for r in records] == [1, 0]  # the other rank first, itself last
    assert records[1]["pid"] == proc.pid and {r["signal"] for r in records} == {"SIGKILL"}
    assert wait_for(lambda: state(records[0]["pid"]) in "-Z")


def test_specs_validate_and_register() -> None:
    for name in ("kill", "hang", "preempt"):
        assert kinds()[name].spec.fault_class == "process"
    with pytest.raises(FaultSpecError, match=r"plan\.faults\[0\]\.grace_seconds:"):
        parse_fault({"kind": "preempt", "at_step": 1, "grace_seconds": -1}, "plan.faults[0]")
    with pytest.raises(FaultSpecError, match=r"plan\.faults\[0\]\.resume_after:"):
        parse_fault({"kind": "hang", "at_step": 1, "resume_after": 0}, "plan.faults[0]")
    with pytest.raises(FaultSpecError, match=r"plan\.faults\[0\]\.signal:"):
        parse_fault({"kind": "kill", "at_step": 1, "signal": 9}, "plan.faults[0]")
