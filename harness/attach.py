"""Attach the agent to a trainer that knows nothing of tightrope: hooks instead of calls.

``agent = harness.attach(model, optimizer, run_dir="runs/x", plan="plan.yaml")``; then,
optionally, ``loader = agent.wrap_batches(loader)`` and ``agent.close()``. A step opens at
the first of a batch from `wrap_batches`, a grad-enabled forward of the model, a
``backward()``, the optimizer step, and ends when ``optimizer.step`` returns. In its
pre-hook gradient faults act (after the trainer's clipping), the gradient norm is measured
(so it shows them), then lr faults act. See docs/attach.md.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from faults import FaultPlan, FaultSpecError
from harness.agent import Agent
from harness.journal import journal_path

B = TypeVar("B")
Listener = Callable[[torch.Tensor], None]

#: Wrappers (DDP, DataParallel, torch.compile) that hold the user's model, and where.
WRAPPERS = {
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "OptimizedModule": "_orig_mod",
}


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DDP, DataParallel or torch.compile wrappers (names as the user's)."""
    while (attr := WRAPPERS.get(type(model).__name__)) and isinstance(
        inner := getattr(model, attr, None), nn.Module
    ):
        model = inner
    return model


def topology(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): given, else torch.distributed's, else env RANK/WORLD_SIZE, else 0/1."""
    joined = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if joined else int(os.environ.get("RANK", "0"))
    if world_size is None:
        world_size = dist.get_world_size() if joined else int(os.environ.get("WORLD_SIZE", "1"))
    return rank, world_size


def restart_count() -> int:
    """How many times torchrun restarted the workers (0 outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


# -- torch.Tensor.backward, wrapped while anything listens --------------------------------

_listeners: list[Listener] = []
_original_backward: Callable[..., Any] | None = None


def add_backward_listener(listener: Listener) -> None:
    """Call ``listener(tensor)`` before every ``tensor.backward()`` (wraps it on first use)."""
    global _original_backward
    if _original_backward is None:
        original: Callable[..., Any] = torch.Tensor.backward

        @functools.wraps(original)
        def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            for each in tuple(_listeners):
                each(self)
            return original(self, *args, **kwargs)

        _original_backward = original
        setattr(torch.Tensor, "backward", backward)  # noqa: B010 - mypy refuses a method assign
    _listeners.append(listener)


def remove_backward_listener(listener: Listener) -> None:
    """Stop calling ``listener``; the original ``backward`` comes back with the last one."""
    global _original_backward
    if listener in _listeners:
        _listeners.remove(listener)
    if not _listeners and _original_backward is not None:
        setattr(torch.Tensor, "backward", _original_backward)  # noqa: B010
        _original_backward = None


_exit_status: list[SystemExit] = []  # the last sys.exit call, for the atexit hook


def watch_exit() -> None:
    """Wrap ``sys.exit`` (once) to note its status: atexit cannot see why Python exits."""
    original = sys.exit
    if getattr(original, "_tightrope", False):
        return

    def exit(status: Any = None) -> NoReturn:
        _exit_status[:] = [SystemExit(status)]
        original(status)

    exit._tightrope = True  # type: ignore[attr-defined]
    sys.exit = exit


def check_plan(plan: FaultPlan) -> FaultPlan:
    """``plan``, unless it holds a fault an attached trainer cannot meet (a data fault)."""
    for i, spec in enumerate(plan):
        if spec.fault_class == "data":
            raise FaultSpecError(
                f"plan.faults[{i}]: {spec.kind} acts on the reference trainer's document "
                "stream; an attached trainer has none (see docs/attach.md)"
            )
    return plan


def grad_norm(optimizer: torch.optim.Optimizer) -> float | None:
    """Global L2 norm of the optimizer's gradients; None when none has a gradient."""
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return None
    with torch.no_grad():
        return float(torch.nn.utils.get_total_norm(grads))


def replace_first(batch: B, through: Callable[[torch.Tensor], torch.Tensor]) -> B:
    """``batch`` with its token tensor passed ``through``: the batch itself when a tensor,
    the first item of a tuple/list, or ``input_ids`` of a mapping (copied as a dict)."""
    if isinstance(batch, torch.Tensor):
        return cast(B, through(batch))
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        first = through(batch[0])
        if first is batch[0]:
            return batch
        items = [first, *batch[1:]]
        return cast(B, type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items))
    if isinstance(batch, Mapping) and isinstance(ids := batch.get("input_ids"), torch.Tensor):
        new = through(ids)
        return batch if new is ids else cast(B, {**batch, "input_ids": new})
    return batch


class AttachedAgent:
    """An `Agent` driven by hooks on a foreign trainer's model, optimizer and ``backward``."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._open = False  # a step has begun and not ended
        self._in_step = False  # between the optimizer's pre- and post-hooks
        self._closed = False
        self._loss: torch.Tensor | None = None
        self._grad_norm: float | None = None
        self._lr: float | None = None
        self._last: float | None = None  # perf_counter at the end of the last step
        self._model_hook: RemovableHandle | None = None
        self._handles: list[RemovableHandle] = []
        self._own_batches = False  # wrap_batches feeds batch faults, not the forward hook
        self._pid = os.getpid()
        #: ``backward()`` calls seen in the current step.
        self.backward_calls = 0
        add_backward_listener(self.on_backward)
        atexit.register(self._at_exit)
        watch_exit()

    # -- what a user sees ----------------------------------------------------------------

    @property
    def step(self) -> int:
        """Optimizer steps completed (the step in progress, while one is)."""
        return self.agent.step

    @property
    def journal(self) -> Path:
        """This rank's journal file."""
        return journal_path(self.agent.run_dir, self.agent.rank)

    def wrap_batches(self, batches: Iterable[B]) -> Iterator[B]:
        """Yield ``batches``, each opening its step and passing bad-data faults (see
        `replace_first` for which part of a batch they replace)."""
        self._own_batches = True
        return self._through(batches)

    def _through(self, batches: Iterable[B]) -> Iterator[B]:
        for batch in batches:
            if not self._closed:
                self.open_step()
                batch = replace_first(batch, self.agent.batch)
            yield batch

    def close(self, status: str = "completed", reason: str = "") -> None:
        """End any open step, remove every hook and journal ``run_end``; idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        remove_backward_listener(self.on_backward)
        for handle in [*self._handles, *([self._model_hook] if self._model_hook else [])]:
            handle.remove()
        try:
            if self._open:
                self.agent.end_step()  # undo temporary changes (lr spike, forward hooks)
        finally:
            self._open = self._in_step = False
            self.agent.close(status, reason)

    def __enter__(self) -> AttachedAgent:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close_for(exc)

    def _close_for(self, exc: BaseException | None) -> None:
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
            self.close()
        elif isinstance(exc, KeyboardInterrupt):
            self.close("stopped", "interrupted by the user")
        else:
            self.close("failed", f"{type(exc).__name__}: {exc}")

    def _at_exit(self) -> None:
        # The interpreter sets sys.last_value for the uncaught exception it is exiting on.
        if os.getpid() == self._pid:
            exc = getattr(sys, "last_value", None)
            self._close_for(exc if exc is not None or not _exit_status else _exit_status[-1])

    # -- wiring --------------------------------------------------------------------------

    def begin(self) -> None:
        """Journal ``run_start`` (and ``restart`` when torchrun restarted the workers)."""
        model = self.agent.model
        first = next(model.parameters(), None) if model is not None else None
        self.agent.start(0, **({"device": first.device.type} if first is not None else {}))
        if count := self.agent.journal.restart:
            self.agent.claim("restart", count=count, reason="launcher restarted the workers")

    def set_model(self, model: nn.Module) -> None:
        """Watch ``model`` (already unwrapped): its forward opens steps, feeds batch faults."""
        if self._model_hook is not None:
            self._model_hook.remove()
        self.agent.model = model
        self._model_hook = model.register_forward_pre_hook(self.on_forward, with_kwargs=True)

    def hook_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Drive steps from ``optimizer``'s own step hooks."""
        self.agent.optimizer = optimizer
        self._handles.append(optimizer.register_step_pre_hook(self.on_step_begin))
        self._handles.append(optimizer.register_step_post_hook(self.on_step_end))

    # -- hook entry points ---------------------------------------------------------------

    def open_step(self) -> None:
        """Begin the next step unless one is open."""
        if self._open or self._closed:
            return
        self._open = True
        self._loss, self.backward_calls = None, 0
        if self._last is None:
            self._last = time.perf_counter()
        self.agent.begin_step(self.agent.step + 1)

    def on_forward(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """Model forward: opens the step; batch faults replace the first tensor argument
        (or ``input_ids=``) unless `wrap_batches` feeds them."""
        if self._in_step or self._closed or not torch.is_grad_enabled():
            return None
        self.open_step()
        if self._own_batches:
            return None
        if args and isinstance(args[0], torch.Tensor):
            new = self.agent.batch(args[0])
            return None if new is args[0] else ((new, *args[1:]), kwargs)
        new_kwargs = replace_first(kwargs, self.agent.batch)  # input_ids=, when given
        return None if new_kwargs is kwargs else (args, new_kwargs)

    def on_backward(self, tensor: torch.Tensor) -> None:
        """``tensor.backward()``: opens the step; a scalar is the step's loss."""
        if self._in_step or self._closed:
            return
        self.open_step()
        self.backward_calls += 1
        if tensor.numel() == 1:
            self._loss = tensor.detach()

    def on_step_begin(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """Optimizer step pre-hook: gradient faults, gradient norm, lr, lr faults."""
        if optimizer is not self.agent.optimizer or self._in_step or self._closed:
            return
        self.open_step()
        self._in_step = True
        self.agent.after_backward()
        self._grad_norm = grad_norm(optimizer)
        self._lr = float(optimizer.param_groups[0]["lr"])
        self.agent.before_optimizer_step()

    def on_step_end(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """Optimizer step post-hook: weight faults, the `step` event, end-of-step faults."""
        if optimizer is not self.agent.optimizer or not self._in_step or self._closed:
            return
        self.agent.after_optimizer_step()
        now = time.perf_counter()
        started = self._last if self._last is not None else now
        self._last = now
        loss = float(self._loss) if self._loss is not None else math.nan
        self.agent.observe_step(
            loss=loss, grad_norm=self._grad_norm, lr=self._lr, step_time=now - started
        )
        self._open = self._in_step = False
        self._loss = None
        self.agent.end_step()


def attach(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    run_dir: str | os.PathLike[str],
    plan: FaultPlan | str | os.PathLike[str] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    check_params_every: int = 10,
) -> AttachedAgent:
    """Attach an agent to ``model`` and ``optimizer``; the step loop needs no other change."""
    if plan is not None and not isinstance(plan, FaultPlan):
        plan = FaultPlan.from_yaml(Path(plan))
    check_plan(plan or FaultPlan())
    rank, world_size = topology(rank, world_size)
    target = unwrap(model)
    agent = Agent(run_dir, rank=rank, world_size=world_size, restart=restart_count(), plan=plan)
    agent.check_params_every = check_params_every
    attached = AttachedAgent(agent)
    attached.set_model(target)
    attached.hook_optimizer(optimizer)
    attached.begin()
    return attached


class _CallableModule(types.ModuleType):
    """Importing this module makes ``harness.attach`` name it; calling it still attaches."""

    def __call__(self, *args: Any, **kwargs: Any) -> AttachedAgent:
        return attach(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
__all__ = ["AttachedAgent", "attach"]
