"""Launch a trainer as processes, by command line, under a deadline.

The harness never imports the trainer it tests: the reference trainer is run as
``python -m reference_trainer`` (under torchrun when several ranks are asked for), any
other trainer through the zero-code attach, ``tightrope exec -- COMMAND``. Each launch
is its own process group, so the watchdog can kill every rank of a hung or runaway run
at its deadline; the launch then counts as timed out, never as a hung suite.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import TightropeError
from harness.mechanisms import LAUNCHER_MECHANISMS
from harness.records.microscope_file import MICROSCOPE_ENV
from harness.running.process_tree import MARK, kill_marked, kill_tree
from harness.running.warm_start import warm
from harness.suites.scenario import TrainerSpec

_TAIL_LINES = 40


class LaunchError(TightropeError):
    """A trainer command cannot be built or started (missing program, bad placeholder)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """How one process (group) ended."""

    exit_code: int | None
    timed_out: bool
    seconds: float
    #: Killed because the suite was stopped (Ctrl-C, SIGTERM), not by its deadline.
    interrupted: bool = False
    #: Processes of the launch still alive after it ended (killed then); None: not looked.
    left_behind: int | None = None
    #: Those processes, one line each: pid, command line, what started it.
    left_processes: tuple[str, ...] = ()
    #: Wall clock (epoch seconds) when the launch ended.
    ended: float | None = None


def _torchrun(spec: TrainerSpec) -> list[str]:
    # --standalone: a private rendezvous on a free local port, so runs can go in parallel.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(spec.world_size),
        "--max-restarts",
        str(spec.restarts),
    ]


def reference_command(
    spec: TrainerSpec,
    run_dir: Path,
    plan: Path | None,
    *,
    stop_after: int | None = None,
    resume: bool = False,
    elastic: bool = False,
    head: list[str] | None = None,
) -> list[str]:
    """The reference trainer's command line for ``spec``; under torchrun for several
    ranks, or with ``elastic`` (process faults: a lost worker is restarted). ``head``
    replaces the launcher part (a node's own torchrun)."""
    if head is None:
        head = _torchrun(spec) if spec.world_size > 1 or elastic else [sys.executable]
    argv = [*head, "-m", "reference_trainer", "--run-dir", str(run_dir)]
    argv += ["--steps", str(spec.steps), "--checkpoint-every", str(spec.checkpoint_every)]
    if resume:
        return [*argv, "--resume", *(["--fault-plan", str(plan)] if plan else [])]
    argv += ["--preset", spec.model, "--seed", str(spec.seed), "--precision", spec.precision]
    if spec.batch_size is not None:
        argv += ["--batch-size", str(spec.batch_size)]
    if spec.preset == "fragile":
        argv.append("--fragile")
    for name in spec.disable:
        if name not in LAUNCHER_MECHANISMS:  # the launcher's, not the trainer's
            argv += ["--disable", name]
    for name in spec.enable:
        argv += ["--enable", name]
    if spec.data_mix is not None:
        argv += ["--data-mix", spec.data_mix]
    if spec.optimizer is not None:
        argv += spec.optimizer.flags()
    if stop_after is not None:
        argv += ["--stop-after", str(stop_after)]
    if plan is not None:
        argv += ["--fault-plan", str(plan)]
    return argv


def custom_command(spec: TrainerSpec, run_dir: Path, plan: Path | None) -> list[str]:
    """A user's trainer command, placeholders filled, run through ``tightrope exec``.

    It runs in another working directory (`trainer_cwd`), so every argument that names a
    file here becomes an absolute path."""
    assert spec.command is not None
    user = split_command(
        spec.command,
        run_dir=run_dir.resolve(),
        steps=spec.steps,
        seed=spec.seed,
        world_size=spec.world_size,
        python=sys.executable,
    )
    user = [str(Path(word).resolve()) if _names_a_file(word) else word for word in user]
    head = [sys.executable, "-m", "harness", "exec", "--run-dir", str(run_dir.resolve())]
    if plan is not None:
        head += ["--plan", str(plan.resolve())]
    return [*head, "--", *user]


def _names_a_file(word: str) -> bool:
    if word.startswith("-") or Path(word).is_absolute():
        return False
    try:
        return Path(word).is_file()
    except OSError:  # a word too long to be a path
        return False


def trainer_cwd(spec: TrainerSpec, run_dir: Path) -> Path | None:
    """Where a command trainer runs: ``cwd`` when given, else its own run dir; None (here)
    for the reference trainer."""
    if spec.command is None:
        return None
    return Path(spec.cwd).resolve() if spec.cwd is not None else run_dir.resolve()


def split_command(command: str, **values: object) -> list[str]:
    """Split a command line and fill its placeholders; errors name what is wrong."""
    try:
        filled = command.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise LaunchError(
            f"trainer command {command!r}: bad placeholder {exc}; the known ones are "
            f"{', '.join('{' + k + '}' for k in values)}"
        ) from None
    try:
        argv = shlex.split(filled)
    except ValueError as exc:
        raise LaunchError(f"trainer command {command!r} cannot be split: {exc}") from None
    if not argv:
        raise LaunchError("trainer command is empty")
    return argv


def check_command(spec: TrainerSpec) -> None:
    """Refuse, before anything runs, a command whose program does not exist."""
    if spec.command is None:
        return
    program = split_command(
        spec.command, run_dir="RUN", steps=1, seed=0, world_size=1, python=sys.executable
    )[0]
    if shutil.which(program) is None and not Path(program).is_file():
        raise LaunchError(f"trainer command {spec.command!r}: program {program!r} not found")


def run_process(
    argv: Sequence[str],
    *,
    log: Path,
    deadline: float,
    env: dict[str, str],
    on_poll: Callable[[], None] | None = None,
    cwd: Path | None = None,
    stop: threading.Event | None = None,
) -> Launch:
    """Run ``argv`` with output appended to ``log``; kill its whole group at ``deadline``.

    ``deadline`` is a ``time.monotonic()`` instant; ``on_poll`` runs every ~0.2 s while
    the process lives (progress display); once ``stop`` is set the launch is killed as at
    its deadline, within 0.2 s.
    """
    # Every process of the launch inherits the mark, so none escapes the clean-up below.
    mark = uuid.uuid4().hex
    env = {**env, MARK: mark}
    # A warm-start server started for it (the test suite's) is not the launch's time.
    command = warm(argv, env)
    started = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"$ {shlex.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: {exc.strerror}") from exc
        timed_out = interrupted = False
        while True:
            try:
                code: int | None = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if on_poll is not None:
                    on_poll()
                interrupted = stop is not None and stop.is_set()
                if interrupted or time.monotonic() >= deadline:
                    timed_out = not interrupted
                    # SIGKILL: a hung rank may be stopped (SIGSTOP) and ignore anything else.
                    kill_tree(proc.pid)
                    proc.wait()
                    code = None
                    break
    # Whatever the launch left behind (a worker orphaned by a killed launcher, a trainer's
    # background child) ends with it, and is counted (`no_processes_left`); a second lets
    # what was just killed, or is following its parent out, end by itself first.
    left = kill_marked(mark, grace=1.0)
    seconds = time.monotonic() - started
    return Launch(
        code,
        timed_out,
        seconds,
        interrupted,
        left_behind=len(left),
        left_processes=tuple(p.describe() for p in left),
        ended=time.time(),
    )


def log_tail(log: Path, lines: int = _TAIL_LINES) -> str:
    """The last lines of a launch log (empty when there is none)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def trainer_env(spec: TrainerSpec) -> dict[str, str]:
    """The environment a trainer runs with: ours, one thread per rank, the microscope on,
    the spec's own."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault(MICROSCOPE_ENV, "on")  # every scenario's views (docs/journal.md)
    env["PYTHONUNBUFFERED"] = "1"
    if spec.command is not None:
        # It runs elsewhere (trainer_cwd): `python -m pkg` still finds what it found here.
        here = [os.getcwd(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(here)
    env.update(spec.env)
    return env
