"""``tightrope exec``: run a training command unchanged, with the agent attached to it.

``tightrope exec --run-dir D [--plan P] -- python train.py ...`` checks its input, then
replaces itself with the command (like a shell's ``exec``: same pid, same exit code),
with ``harness/inside/_bootstrap`` first on PYTHONPATH and the run dir and plan in
``TIGHTROPE_RUN_DIR`` / ``TIGHTROPE_PLAN``. Every Python process of the command (torchrun's
workers too) then runs that folder's ``sitecustomize``, which calls
`harness.inside.exec_runtime.bootstrap` right after the program imports torch.

This side imports no torch: the command imports it anyway, and twice would cost a second
of start-up.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from faults import FaultPlan
from harness.errors import TightropeError
from harness.inside.exec_env import check_plan, child_env
from harness.run_layout import RunLayout
from harness.running.process_tree import kill_tree
from harness.running.run_lock import RunDirLock
from harness.running.warm_start import warm_exec


class ExecError(TightropeError):
    """``tightrope exec`` was given something it cannot run."""


# -- the command ---------------------------------------------------------------------------


def check(command: Sequence[str], run_dir: Path, plan: Path | None) -> list[str]:
    """The command to run, after every check ``exec`` makes before starting it."""
    command = list(command[1:] if command and command[0] == "--" else command)
    if not command:
        raise ExecError("exec: no command after '--' (tightrope exec ... -- python train.py)")
    if plan is not None:
        faults = check_plan(FaultPlan.from_yaml(plan))  # a FaultSpecError names the field
        if not len(faults):
            raise ExecError(f"--plan {plan} holds no fault; leave the flag out for none")
    if run_dir.exists() and not run_dir.is_dir():
        raise ExecError(f"--run-dir {run_dir} exists and is not a directory")
    if RunLayout(run_dir).journal.exists():
        raise ExecError(
            f"--run-dir {run_dir} already holds a journal (another run's); choose another"
        )
    if shutil.which(command[0]) is None:
        raise ExecError(f"exec: command not found: {command[0]}")
    return command


def run_command(
    command: Sequence[str], *, run_dir: Path, plan: Path | None, timeout: float | None = None
) -> int:
    """Check the input, then run the command with the agent's bootstrap in its way.

    Without ``timeout``, become the command (its pid and exit code). With it, run the
    command in its own session, forward SIGTERM/SIGINT to its process group, and at the
    deadline kill the whole group and every process below the command (SIGKILL) and return
    124; otherwise return the command's exit code (128 + N when signal N ended it, as a
    shell reports it).
    """
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ExecError(f"--timeout must be a number of seconds greater than 0, got {timeout:g}")
    argv = check(command, run_dir, plan)
    # The run dir is the command's: exec holds its lock, and the command keeps it across
    # the exec below (same process) or shares it through its environment.
    claim = RunDirLock.acquire(run_dir, inheritable=timeout is None)
    env = {**child_env(os.environ, run_dir, plan), **claim.env()}
    sys.stdout.flush()
    sys.stderr.flush()
    if timeout is None:
        argv = warm_exec(argv, env)  # forked warm where the test suite's launcher asks
        os.execvpe(argv[0], argv, env)
    # Signals that reach exec go to the command's group; one arriving before the command
    # exists waits for it rather than being lost.
    procs: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def signal_group(signum: int) -> None:
        for proc in procs:
            if proc.returncode is None:  # a reaped pid may already name another group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signum)
        if not procs:
            pending.append(signum)

    forwarded = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda n, _f: signal_group(n)) for sig in forwarded}
    try:
        # Its own session: a kill of its group reaches every process it started, not ours.
        procs.append(subprocess.Popen(argv, env=env, start_new_session=True))
        for signum in pending:
            signal_group(signum)
        try:
            code = procs[0].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(procs[0].pid)  # its group, and torchrun's workers in their own sessions
            procs[0].wait()
            print(
                f"tightrope exec: timed out after {timeout:g} s; killed the command",
                file=sys.stderr,
            )
            return 124
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(sig, handler)
        claim.release()
    return 128 - code if code < 0 else code
