"""``tightrope exec``: run a training command unchanged, with the agent attached to it.

``tightrope exec --run-dir D [--plan P] -- python train.py ...`` checks its input, then
replaces itself with the command (like a shell's ``exec``: same pid, same exit code),
with ``harness/_bootstrap`` first on PYTHONPATH and the run dir and plan in
``TIGHTROPE_RUN_DIR`` / ``TIGHTROPE_PLAN``. Every Python process of the command (torchrun's
workers too) then runs that folder's ``sitecustomize``, which calls `bootstrap` right
after the program imports torch. `bootstrap` installs PyTorch's global hooks:

- module forward hooks find the model: the first module called at top level (not from
  another module's forward) with grad enabled and trainable parameters, unwrapped from
  DDP; at the first optimizer step the choice is checked against the optimizer's
  parameters (the top-level module holding most of them wins) and the global module
  hooks go away;
- optimizer step hooks bind the agent to the first optimizer that steps and drive the
  steps as `harness.attach` does. The agent (and its journal) starts at the model's
  first forward, or at the first optimizer step.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.hooks import RemovableHandle

from faults import FaultPlan
from harness.agent import Agent
from harness.attach import (
    AttachedAgent,
    check_plan,
    restart_count,
    topology,
    unwrap,
    watch_exit,
)
from harness.errors import TightropeError
from harness.files import add_file_listener, remove_file_listener
from harness.journal import JOURNAL_DIR
from harness.process_group import patch_init_process_group
from harness.process_tree import kill_tree

ENV_RUN_DIR = "TIGHTROPE_RUN_DIR"
ENV_PLAN = "TIGHTROPE_PLAN"
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"


class ExecError(TightropeError):
    """``tightrope exec`` was given something it cannot run."""


# -- the command ---------------------------------------------------------------------------


def child_env(base: Mapping[str, str], run_dir: Path, plan: Path | None) -> dict[str, str]:
    """The command's environment: ``base`` plus the bootstrap folder, run dir and plan."""
    env = dict(base)
    env[ENV_RUN_DIR] = str(run_dir.resolve())
    if plan is not None:
        env[ENV_PLAN] = str(plan.resolve())
    else:
        env.pop(ENV_PLAN, None)
    here = str(BOOTSTRAP_DIR)
    rest = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    env["PYTHONPATH"] = os.pathsep.join([here, *rest])
    return env


def check(command: Sequence[str], run_dir: Path, plan: Path | None) -> list[str]:
    """The command to run, after every check ``exec`` makes before starting it."""
    command = list(command[1:] if command and command[0] == "--" else command)
    if not command:
        raise ExecError("exec: no command after '--' (tightrope exec ... -- python train.py)")
    if plan is not None:
        check_plan(FaultPlan.from_yaml(plan))  # a FaultSpecError names the file and field
    if run_dir.exists() and not run_dir.is_dir():
        raise ExecError(f"--run-dir {run_dir} exists and is not a directory")
    if (run_dir / JOURNAL_DIR).exists():
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
    env = child_env(os.environ, run_dir, plan)
    sys.stdout.flush()
    sys.stderr.flush()
    if timeout is None:
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
    return 128 - code if code < 0 else code


# -- inside the command's processes --------------------------------------------------------


class Runtime:
    """The global hooks of one process: find the model and optimizer, then drive the agent."""

    def __init__(self, run_dir: Path, plan: FaultPlan) -> None:
        self.run_dir = run_dir
        self.plan = plan
        self.attached: AttachedAgent | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._depth = 0  # module forwards in progress
        self._candidates: list[nn.Module] = []  # top-level modules with trainable parameters
        self._seen: set[int] = set()
        self._module_hooks: list[RemovableHandle] = []

    def install(self) -> None:
        """Register the global hooks."""
        self._module_hooks = [
            register_module_forward_pre_hook(self._forward_pre),
            register_module_forward_hook(self._forward_post, always_call=True),
        ]
        register_optimizer_step_pre_hook(self._step_pre)
        register_optimizer_step_post_hook(self._step_post)
        add_file_listener(self)  # a snapshot loaded before the first forward starts the agent
        patch_init_process_group()  # a restarted worker joins without stale addresses

    def _attach(self, model: nn.Module | None) -> AttachedAgent:
        rank, world_size = topology()
        agent = Agent(
            self.run_dir, rank=rank, world_size=world_size, restart=restart_count(), plan=self.plan
        )
        attached = AttachedAgent(agent)
        if model is not None:
            attached.set_model(model)
        # A trainer with no optimizer: once its first step ended, the model is known.
        attached.on_first_step = self._settled
        attached.begin()
        remove_file_listener(self)
        return attached

    def _settled(self) -> None:
        """The first step ended: stop looking for the model (the global hooks cost every
        module call); the optimizer, if one comes later, still binds."""
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks, self._candidates, self._seen = [], [], set()

    # -- files before the agent exists (harness.files calls these) -------------------------

    def _started(self) -> AttachedAgent:
        if self.attached is None:
            self.attached = self._attach(None)
        return self.attached

    def before_save(self, obj: object) -> Callable[[], None]:
        """A save before the first forward starts the agent."""
        return self._started().before_save(obj)

    def saved(self, path: Path, sha256: str, size: int, api: str) -> None:
        """Forward to the agent this call started."""
        self._started().saved(path, sha256, size, api)

    def loaded(self, path: Path, sha256: str, api: str) -> None:
        """A load before the first forward (a resume) starts the agent."""
        self._started().loaded(path, sha256, api)

    def load_failed(self, path: Path, sha256: str | None, error: BaseException, api: str) -> None:
        """A failed load before the first forward starts the agent."""
        self._started().load_failed(path, sha256, error, api)

    def _forward_pre(self, module: nn.Module, args: tuple[Any, ...]) -> Any:
        self._depth += 1
        if self._depth > 1 or id(module) in self._seen or not torch.is_grad_enabled():
            return None
        self._seen.add(id(module))
        if not any(p.requires_grad for p in module.parameters()):
            return None
        model = unwrap(module)
        self._candidates.append(model)
        if self.attached is None:
            self.attached = self._attach(model)
        elif self.attached.agent.model is None:  # started by a file load: the model now
            self.attached.set_model(model)
        else:
            return None
        if model is not module:
            return None  # the wrapped model's own hook fires inside the wrapper's forward
        # The model's own hook was registered too late for this call: act for it here.
        changed = self.attached.on_forward(module, args, {})
        return None if changed is None else changed[0]

    def _forward_post(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self._depth -= 1

    def _owned(self, module: nn.Module, ids: set[int]) -> int:
        return sum(id(p) in ids for p in module.parameters())

    def _bind(self, optimizer: torch.optim.Optimizer) -> AttachedAgent:
        """The first optimizer to step is the one; the model is checked against it."""
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        best = max(
            self._candidates,
            key=lambda m: (self._owned(m, ids), sum(1 for _ in m.modules())),
            default=None,
        )
        if best is not None and self._owned(best, ids) == 0:
            best = None
        if self.attached is None:
            self.attached = self._attach(best)
        elif best is not None and best is not self.attached.agent.model:
            current = self.attached.agent.model
            if current is None or self._owned(best, ids) > self._owned(current, ids):
                self.attached.set_model(best)
        self.optimizer = self.attached.agent.optimizer = optimizer
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks, self._candidates, self._seen = [], [], set()
        return self.attached

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        attached = self._bind(optimizer) if self.optimizer is None else self.attached
        if attached is not None and optimizer is self.optimizer:
            attached.on_step_begin(optimizer)

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.attached is not None and optimizer is self.optimizer:
            self.attached.on_step_end(optimizer)


_runtime: Runtime | None = None


def bootstrap() -> None:
    """Install the global hooks in a process started by ``tightrope exec`` (once)."""
    global _runtime
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir or _runtime is not None:
        return
    plan = os.environ.get(ENV_PLAN)
    _runtime = Runtime(Path(run_dir), FaultPlan.from_yaml(plan) if plan else FaultPlan())
    _runtime.install()
    watch_exit()  # now, before the program's `sys.exit(main())` looks sys.exit up
