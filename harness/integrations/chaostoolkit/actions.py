"""Chaos Toolkit actions: start a job or a suite in the background, stop it, inject a fault.

Each is a plain function a Chaos Toolkit experiment calls as a Python provider::

    {"type": "action", "name": "inject-nan-grad",
     "provider": {"type": "python", "module": "harness.integrations.chaostoolkit.actions",
                  "func": "inject", "arguments": {"run_dir": "runs/chaos", "kind": "nan_grad"}}}

Every result is plain JSON (the experiment's journal records it). A failure raises a
`TightropeError` whose message names the argument or the job: Chaos Toolkit records the
activity as failed with that message.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.errors import JournalError, TightropeError
from harness.live.control import ControlError, send, wait_for_answer
from harness.records.events import StepObserved
from harness.records.journal import Event, read_journal
from harness.run_layout import RunLayout
from harness.running import background
from harness.running.launch import log_tail, reference_command, trainer_env
from harness.suites.scenario import TrainerSpec

#: Where `start_suite` records the suite it started, inside the scorecard directory.
SUITE_RECORD = "background.json"
#: The suite's output (the ``tightrope run`` console report), inside the scorecard directory.
SUITE_LOG = "run.log"


class ChaosActionError(TightropeError):
    """An action's arguments are wrong, or the job did not do what the action asked."""


def _trainer_spec(fields: dict[str, Any]) -> TrainerSpec:
    try:
        return TrainerSpec.model_validate(fields)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        ]
        raise ChaosActionError("start_training: " + "; ".join(problems)) from None


def start_training(
    run_dir: str,
    preset: str = "reference",
    model: str = "tiny",
    steps: int = 2000,
    world_size: int = 1,
    seed: int = 0,
    precision: str = "fp32",
    checkpoint_every: int = 50,
    wait_s: float = 120.0,
) -> dict[str, Any]:
    """Start the reference trainer on ``run_dir`` in the background; return once it has
    journaled its first step (or raise, with the end of its log, when it ended first)."""
    spec = _trainer_spec(
        {
            "preset": preset,
            "model": model,
            "steps": steps,
            "world_size": world_size,
            "seed": seed,
            "precision": precision,
            "checkpoint_every": checkpoint_every,
        }
    )
    layout = RunLayout(run_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    record = background.start(
        reference_command(spec, layout.root, None),
        record_path=layout.background,
        log=layout.log,
        env=trainer_env(spec),
    )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        # Only this job's steps: a reused run directory holds an earlier run's journal.
        events = _journal_or_none(layout.root)
        trained = [e.step for e in events if e.is_(StepObserved) and e.wall >= record.started]
        if trained:
            return {"run_dir": str(layout.root), "pid": record.pid, "step": max(trained)}
        code = background.exit_code(record)  # this process started it: it can tell
        if code is not None:
            raise ChaosActionError(
                f"the trainer in {run_dir} ended (exit {code}) before its first step:\n"
                + log_tail(layout.log, 15)
            )
        time.sleep(0.2)
    background.stop(record, grace=0)
    raise ChaosActionError(f"the trainer in {run_dir} trained no step within {wait_s:g} s")


def _journal_or_none(run_dir: Path) -> list[Event]:
    """The journal's events; none while the job has not created its journal yet."""
    try:
        return list(read_journal(run_dir, warn=False))
    except JournalError:
        return []


def stop_training(run_dir: str, grace_s: float = 10.0) -> dict[str, Any]:
    """Stop the job `start_training` started on ``run_dir`` (SIGTERM, then SIGKILL after
    ``grace_s``); a job that already ended is not an error (a rollback may run twice)."""
    return _stop(RunLayout(run_dir).background, grace_s)


def start_suite(
    suite: str, scorecard: str, preset: str | None = None, select: str | None = None
) -> dict[str, Any]:
    """Start ``tightrope run SUITE --scorecard SCORECARD`` in the background."""
    if not Path(suite).is_file():
        raise ChaosActionError(f"start_suite: suite {suite!r} is not a file")
    argv = [sys.executable, "-m", "harness", "run", suite, "--scorecard", scorecard]
    if preset is not None:
        argv += ["--preset", preset]
    if select is not None:
        argv += ["-k", select]
    folder = Path(scorecard)
    record = background.start(
        argv,
        record_path=folder / SUITE_RECORD,
        log=folder / SUITE_LOG,
        # One thread per rank, as the suite's own launches get (trainer_env).
        env={"OMP_NUM_THREADS": "1", **os.environ},
    )
    return {"scorecard": str(folder), "pid": record.pid}


def wait_for_suite(scorecard: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Wait for the suite `start_suite` started to end; its exit code (0: every scenario
    passed, 1: not, 2: invalid input, 130: interrupted)."""
    path = Path(scorecard) / SUITE_RECORD
    record = background.read_record(path)
    if record is None:
        raise ChaosActionError(f"wait_for_suite: no suite was started into {scorecard}")
    deadline = time.monotonic() + timeout_s
    while background.alive(record):
        if time.monotonic() >= deadline:
            raise ChaosActionError(
                f"the suite into {scorecard} is still running after {timeout_s:g} s"
            )
        time.sleep(0.5)
    # Its processes are gone; the leader may still be exiting, not yet a zombie to reap.
    return {"scorecard": scorecard, "exit_code": background.exit_code(record, wait=10.0)}


def stop_suite(scorecard: str, grace_s: float = 10.0) -> dict[str, Any]:
    """Stop the suite `start_suite` started (it writes a partial scorecard on SIGTERM)."""
    return _stop(Path(scorecard) / SUITE_RECORD, grace_s)


def _stop(path: Path, grace_s: float) -> dict[str, Any]:
    record = background.read_record(path)
    if record is None:
        return {"was_running": False, "ended_gracefully": False, "killed": 0, "left": 0}
    stopped = background.stop(record, grace=grace_s)
    return {
        "was_running": stopped.was_running,
        "ended_gracefully": stopped.ended_gracefully,
        "killed": stopped.killed,
        "left": len(background.alive(record)),
    }


def inject(
    run_dir: str,
    kind: str,
    params: dict[str, Any] | None = None,
    rank: int | None = None,
    in_steps: int = 1,
    wait_s: float = 30.0,
) -> dict[str, Any]:
    """Arm a fault in the running job, as ``tightrope inject`` does; the step it takes
    effect at. Raises when the job refuses it or does not answer within ``wait_s``."""
    fault: dict[str, Any] = {"kind": kind, **(params or {})}
    if rank is not None:
        fault["ranks"] = [rank]
    command = send(run_dir, fault, in_steps=in_steps)
    answer = wait_for_answer(run_dir, command.id, wait_s)
    if answer is None:
        raise ControlError(
            f"no answer from the job in {run_dir} within {wait_s:g} s (is it running?); the "
            "command was withdrawn"
        )
    if not answer.accepted:
        raise ControlError(f"the job refused {command.id}: {answer.reason}")
    return {
        "id": command.id,
        "kind": kind,
        "step": answer.step,
        "effective_step": answer.effective_step,
    }
