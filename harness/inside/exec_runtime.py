"""Inside the processes of a command run by ``tightrope exec``: the agent's global hooks.

The bootstrap's ``sitecustomize`` calls `bootstrap` right after the program imports torch.
It installs PyTorch's global hooks:

- module forward hooks find the model: the first module called at top level (not from
  another module's forward) with grad enabled and trainable parameters, unwrapped from
  DDP; at the first optimizer step the choice is checked against the optimizer's
  parameters (the top-level module holding most of them wins), or, with no optimizer, once
  the first step ended, and the global module hooks go away;
- optimizer step hooks bind the agent to the first optimizer that steps and drive the
  steps as `harness.inside.attach` does;
- file listeners start the agent at a load or save before the first forward (a restarted
  worker resuming from its snapshot);
- a worker's ``init_process_group`` joins under a prefix per restart
  (`harness.inside.process_group`).

The agent (and its journal) starts at the first of those.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.hooks import RemovableHandle

from faults import FaultPlan
from harness.inside.agent import Agent
from harness.inside.exec_env import ENV_PLAN, ENV_RUN_DIR
from harness.inside.files import add_file_listener, remove_file_listener
from harness.inside.process_group import patch_init_process_group
from harness.inside.trainer_shape import (
    data_parallel,
    restart_count,
    topology,
    unwrap,
    watch_exit,
)

if TYPE_CHECKING:
    # Imported when the first step needs it: a program that imports it (and, through it,
    # torch) is still importing it when torch's import starts this module.
    from harness.inside.attach import AttachedAgent


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
        from harness.inside.attach import CHECK_EVERY, AttachedAgent

        rank, world_size = topology()
        agent = Agent(
            self.run_dir,
            rank=rank,
            world_size=world_size,
            restart=restart_count(),
            plan=self.plan,
            check_params_every=CHECK_EVERY,
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

    # -- files before the agent exists (harness.inside.files calls these) -------------------------

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
        if (wrapper := data_parallel(module)) is not None:
            self.attached.agent.watch_data_parallel(wrapper)
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
        if self.attached.agent.model is not None:
            self._settled()
        # else the forward comes later, inside the step's closure (Lightning), or after a
        # step that only created the optimizer's state (DCP): keep looking for the model.
        return self.attached

    def _step_pre(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        attached = self._bind(optimizer) if self.optimizer is None else self.attached
        if attached is not None and optimizer is self.optimizer:
            return attached.on_step_begin(optimizer, args, kwargs)
        return None

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
