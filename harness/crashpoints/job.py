"""One run of the job under exploration: its command with ``{run_dir}`` filled, the
crash-point hook armed (recording, or killing at a point), the agent fingerprinting every
step; the other ranks stopped ``grace`` seconds after the point's rank died.

A command trainer runs through the agent's bootstrap as ``tightrope exec`` runs it (the
same environment: `harness.inside.exec_env.child_env`); the reference trainer has its own
agent and gets only the bootstrap folder on PYTHONPATH (for the hook). A job of several
ranks is one command that starts them (torchrun): the hook arms in its workers (those with
``RANK``), not in torchrun itself.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.crashpoints.zygote import Zygote, forkable
from harness.inside.crash_hook import (
    ENV_AT,
    ENV_IGNORE,
    ENV_LOG,
    ENV_RANKS,
    ENV_WATCH,
    log_path,
)
from harness.inside.exec_env import BOOTSTRAP_DIR, ENV_FINGERPRINT, child_env
from harness.inside.zygote import AGENT_PRELOAD
from harness.run_layout import RunLayout
from harness.running.launch import Launch, run_process

PLACEHOLDER = "{run_dir}"


def ignored(run_dir: Path) -> list[str]:
    """What in a run dir is tightrope's own or a monitor's, never a save: not counted."""
    layout = RunLayout(run_dir)
    paths = [
        layout.lock,
        layout.journal,
        layout.control,
        layout.heartbeats,
        layout.metrics,
        layout.microscope,
        layout.log,
        layout.plan,
    ]
    return [str(p.relative_to(run_dir)) for p in paths]


@dataclass(frozen=True, slots=True)
class Target:
    """How to run and resume the job."""

    train: tuple[str, ...]
    resume: tuple[str, ...]
    ranks: int = 1
    #: Through the agent's bootstrap (a command trainer); False: the reference trainer.
    attach: bool = True
    grace: float = 3.0
    timeout: float = 600.0

    def argv(self, template: Sequence[str], run_dir: Path) -> list[str]:
        """``template`` with the run dir in place of ``{run_dir}``."""
        return [word.replace(PLACEHOLDER, str(run_dir)) for word in template]


@dataclass(frozen=True, slots=True)
class JobEnd:
    """How one run of the job ended."""

    exit_code: int | None
    timed_out: bool
    seconds: float
    #: The point's rank killed itself at the point (its log says so).
    killed: bool = False


def _env(target: Target, run_dir: Path, log_base: Path | None, at: str | None) -> dict[str, str]:
    base = dict(os.environ)
    base.setdefault("OMP_NUM_THREADS", "1")
    base["PYTHONUNBUFFERED"] = "1"
    if target.attach:
        env = child_env(base, run_dir, None)
    else:
        env = dict(base)
        env.pop("TIGHTROPE_RUN_DIR", None)
        rest = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), *rest])
    env[ENV_FINGERPRINT] = "1"
    for name in (ENV_LOG, ENV_WATCH, ENV_AT, ENV_IGNORE, ENV_RANKS):
        env.pop(name, None)
    if log_base is not None:
        env[ENV_LOG] = str(log_base)
        env[ENV_WATCH] = str(run_dir.resolve())
        env[ENV_IGNORE] = os.pathsep.join(ignored(run_dir))
        env[ENV_RANKS] = str(target.ranks)
        if at is not None:
            env[ENV_AT] = at
    return env


def start_zygote(target: Target, log: Path, preload: tuple[str, ...] = ()) -> Zygote | None:
    """A zygote for the job's runs (`harness.crashpoints.zygote`) that imports ``preload``
    too, when its command is one Python process (one rank, ``python SCRIPT.py`` or
    ``python -m MODULE``); else None."""
    if target.ranks != 1 or not forkable(target.train, target.train[0]):
        return None
    agent = AGENT_PRELOAD if target.attach else ()
    env = _env(target, log.parent / "run", None, None)
    return Zygote(target.train[0], env, log, (*agent, *preload))


def died(log: Path) -> float | None:
    """When the point's rank killed itself, from its event log; None when it did not."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines[-3:]):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "killed" in record:
            return float(record["wall"])
    return None


def run_job(
    target: Target,
    template: Sequence[str],
    run_dir: Path,
    *,
    output: Path,
    log_base: Path | None = None,
    at: tuple[int, str] | None = None,
    halt: threading.Event | None = None,
    zygote: Zygote | None = None,
) -> JobEnd:
    """Run ``template`` once on ``run_dir``; ``log_base``: record file events there;
    ``at`` = (rank, `crash_hook.point_spec`): that rank dies there, the others ``grace`` later;
    once ``halt`` is set (the exploration was stopped) the job is killed; forked from
    ``zygote`` where it serves the run."""
    spec = None if at is None else at[1]
    env = _env(target, run_dir, log_base, spec)
    stop = threading.Event()
    watched = None if at is None or log_base is None else Path(log_path(str(log_base), at[0]))
    seen: list[float] = []

    def poll() -> None:
        if halt is not None and halt.is_set():
            stop.set()
        if watched is None or stop.is_set():
            return
        if not seen:
            when = died(watched)
            if when is None:
                return
            seen.append(time.monotonic())
        if time.monotonic() - seen[0] >= target.grace:
            stop.set()  # the rest of the job, as a cluster stops a job that lost a rank

    argv = target.argv(template, run_dir)
    deadline = time.monotonic() + target.timeout
    launch: Launch | None = None
    if zygote is not None and zygote.serves(argv, env):
        launch = zygote.run(argv, log=output, deadline=deadline, env=env, on_poll=poll, stop=stop)
    if launch is None:
        launch = run_process(argv, log=output, deadline=deadline, env=env, on_poll=poll, stop=stop)
    killed = watched is not None and died(watched) is not None
    return JobEnd(launch.exit_code, launch.timed_out, launch.seconds, killed)
