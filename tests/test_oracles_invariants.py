"""The soak's invariant checks, each with the run that must fail it: no stall past the
bound, finite weights in every kept step, no process left behind."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from harness.oracles import (
    KeptParamsFiniteOracle,
    ParamsFiniteOracle,
    ProcessesLeftOracle,
    StallOracle,
)
from harness.oracles.verdict import Evidence
from harness.records.journal import Event, Journal
from harness.running.launch import run_process


def _event(kind: str, step: int, wall: float, restart: int = 0, rank: int = 0, **f: Any) -> Event:
    return Event(kind, step, rank, restart, wall, wall, f)


def _evidence(events: list[Event], **extra: Any) -> Evidence:
    return Evidence(journal=Journal(events), run_dir=Path("."), target_steps=10, **extra)


def test_stall_passes_under_its_bound_and_fails_over_it_naming_the_step() -> None:
    steps = [_event("step", s, float(s), loss=1.0) for s in range(1, 6)]
    hung = [*steps, _event("step", 6, 5.0 + 45.0, restart=1, loss=1.0)]
    assert StallOracle(bound=60).judge(_evidence(hung)).status == "passed"
    check = StallOracle(bound=30).judge(_evidence(hung))
    assert check.status == "failed" and check.figure == 45.0
    assert "after step 5" in check.detail and "before step 6" in check.detail


def test_a_run_killed_while_hung_fails_on_the_wait_until_the_launch_ended() -> None:
    steps = [_event("step", s, float(s), loss=1.0) for s in range(1, 6)]
    assert StallOracle(bound=10).judge(_evidence(steps, ended=6.0)).status == "passed"
    check = StallOracle(bound=10).judge(_evidence(steps, ended=305.0))
    assert check.status == "failed" and "before the launch ended" in check.detail


def test_stall_is_not_judged_without_steps() -> None:
    check = StallOracle(bound=10).judge(_evidence([_event("run_start", 0, 1.0)]))
    assert check.status == "not judged"
    one = [_event("step", 1, 1.0, loss=1.0)]  # one step, and the launch's end unknown
    assert StallOracle(bound=10).judge(_evidence(one)).status == "not judged"
    assert StallOracle(bound=10).judge(_evidence(one, ended=2.0)).status == "passed"


def test_a_non_finite_step_rolled_back_fails_params_finite_but_not_kept_params_finite() -> None:
    events = [
        _event("step", 1, 1.0, loss=1.0, params_finite=True),
        _event("step", 2, 2.0, loss=1.0, params_finite=False),  # a flip, then a rollback
        _event("step", 2, 3.0, loss=1.0, params_finite=True),
        _event("step", 3, 4.0, loss=1.0, params_finite=True),
    ]
    assert ParamsFiniteOracle().judge(_evidence(events)).status == "failed"
    assert KeptParamsFiniteOracle().judge(_evidence(events)).status == "passed"


def test_kept_params_finite_fails_when_a_kept_step_is_non_finite() -> None:
    events = [
        _event("step", 1, 1.0, loss=1.0, params_finite=True),
        _event("step", 2, 2.0, loss=1.0, params_finite=False),
        _event("step", 3, 3.0, loss=1.0),
    ]
    check = KeptParamsFiniteOracle().judge(_evidence(events))
    assert check.status == "failed" and "step 2" in check.detail


def test_processes_left_passes_on_none_fails_on_some_and_is_not_judged_unlooked() -> None:
    assert ProcessesLeftOracle().judge(_evidence([], left_behind=0)).status == "passed"
    check = ProcessesLeftOracle().judge(_evidence([], left_behind=2))
    assert check.status == "failed" and "2 processes outlived" in check.detail
    assert ProcessesLeftOracle().judge(_evidence([])).status == "not judged"


def test_a_launch_counts_the_process_it_left_behind_and_a_clean_one_none(tmp_path: Path) -> None:
    def launch(script: str) -> int | None:
        deadline = time.monotonic() + 30
        done = run_process(["sh", "-c", script], log=tmp_path / "log", deadline=deadline,
                           env=dict(os.environ))  # fmt: skip
        return done.left_behind

    assert launch("true") == 0
    # A background child that outlives its shell: killed by the harness, and counted.
    assert launch("sleep 30 & exit 0") == 1


def test_a_process_left_behind_is_named_with_what_started_it(tmp_path: Path) -> None:
    # A process that outlives its launch, and the fault's delayed-signal helper aimed at it.
    script = (
        "import signal, subprocess; from faults.process import signal_later; "
        "target = subprocess.Popen(['sleep', '30'], start_new_session=True); "
        "signal_later(target.pid, signal.SIGCONT, 30, poll=True, started_by='hang fault on rank 1')"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    done = run_process([sys.executable, "-c", script], log=tmp_path / "log",
                       deadline=time.monotonic() + 30, env=env)  # fmt: skip
    assert done.left_behind == 2, done.left_processes
    helper, sleeper = sorted(done.left_processes, key=lambda line: "sleep 30" in line)
    assert "-c '# tightrope delayed-signal helper (faults/process.py)' " in helper
    assert "started by hang fault on rank 1: SIGCONT to pid " in helper and "after 30 s" in helper
    assert sleeper.startswith("pid ") and "(sleep 30)" in sleeper
    check = ProcessesLeftOracle().judge(
        _evidence([], left_behind=2, left_processes=done.left_processes)
    )
    assert check.status == "failed" and helper in check.detail and sleeper in check.detail
