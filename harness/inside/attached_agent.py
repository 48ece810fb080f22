"""The attached agent: an `Agent` driven by hooks on a foreign trainer, which finds where
each step begins and ends from what the trainer does (`AttachedAgent`; docs/attach.md).
`harness.inside.attach` makes one; so does ``tightrope exec`` (`harness.inside.exec_runtime`).
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from harness.inside.agent import Agent
from harness.inside.attached_files import SaveAndLoadEvidence
from harness.inside.files import (
    add_file_listener,
    remove_file_listener,
    settle_memory_saves,
)
from harness.inside.hooks import (
    Closure,
    ForwardHook,
    StepBeginHook,
    StepEndHook,
    add_backward_listener,
    remove_backward_listener,
    with_closure,
)
from harness.inside.step_evidence import (
    GradMark,
    ParamSample,
    creates_state,
    has_no_grads,
    params_fingerprint,
    params_finite,
)
from harness.inside.step_identity import Numbering, batch_fingerprint, earlier_batches, number
from harness.inside.trainer_shape import (
    B,
    exit_statuses,
    first_tensor,
    grad_norm,
    replace_first,
    watch_exit,
)
from harness.records.events import (
    OMIT,
    Restart,
    StepObserved,
)
from harness.run_layout import RunLayout

#: The agents attached in this process (by `attach` or ``tightrope exec``); `claim` speaks
#: through the last.
ATTACHED: list[AttachedAgent] = []


class AttachedAgent(SaveAndLoadEvidence):
    """An `Agent` driven by hooks on a foreign trainer's model, optimizer, ``backward`` and
    its file saves and loads (those in `harness.inside.attached_files`).

    A step opens at the first of a batch from `wrap_batches`, a grad-enabled forward of the
    model, a ``backward()``, the optimizer step. It ends when ``optimizer.step`` returns or,
    for a trainer that skipped its update or updates by hand, at the next forward,
    backward or save that finds the parameters changed (an update by hand) or the gradients
    cleared without a change (a skipped step); otherwise another forward and backward is
    gradient accumulation within the same step.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._open = False  # a step has begun and not ended
        self._in_step = False  # between the optimizer's pre- and post-hooks (its update)
        self._closure = False  # inside optimizer.step, its closure not returned yet
        self._no_grads = False  # the optimizer stepped with no gradient at all: no update
        self._ignored: torch.optim.Optimizer | None = None  # a step that only made state
        self._before: int | None = None  # parameters' fingerprint before a faulted update
        self._batch: str | None = None  # the open step's batch fingerprint
        self._resumed_from: int | None = None  # step of the save loaded before training
        self._numbering: Numbering | None = None  # how that process's first step was found
        self._backward_seen = False  # the open step had a backward
        self._closed = False
        self._loss: torch.Tensor | None = None
        self._grad_norm: float | None = None
        self._lr: float | None = None
        self._last: float | None = None  # perf_counter at the end of the last step
        self._model_hook: RemovableHandle | None = None
        self._handles: list[RemovableHandle] = []
        self._own_batches = False  # wrap_batches feeds batch faults, not the forward hook
        self._pid = os.getpid()
        self._params: ParamSample | None = None  # the parameters as the step began
        self._grads: GradMark | None = None  # a gradient as the last backward left it
        self._began = False  # a step began in this process
        #: Called once, when the first step ends (exec mode stops looking for the model).
        self.on_first_step: Callable[[], None] | None = None
        #: ``backward()`` calls seen in the current step.
        self.backward_calls = 0
        add_backward_listener(self)
        add_file_listener(self)
        ATTACHED.append(self)
        atexit.register(self._at_exit)
        watch_exit()

    # -- what a user sees ----------------------------------------------------------------

    @property
    def step(self) -> int:
        """Steps completed (the step in progress, while one is)."""
        return self.agent.step

    @property
    def closed(self) -> bool:
        """True once `close` ran."""
        return self._closed

    @property
    def journal(self) -> Path:
        """This rank's journal file."""
        return RunLayout(self.agent.run_dir).journal_file(self.agent.rank)

    def wrap_batches(self, batches: Iterable[B]) -> Iterator[B]:
        """Yield ``batches``, each opening its step and passing bad-data faults (see
        `replace_first` for which part of a batch they replace)."""
        self._own_batches = True
        return self._through(batches)

    def _through(self, batches: Iterable[B]) -> Iterator[B]:
        for batch in batches:
            if not self._closed:
                self._boundary()
                self._see_batch(batch)
                self.open_step()
                batch = replace_first(batch, self.agent.batch)
            yield batch

    def close(self, status: str = "completed", reason: str = "") -> None:
        """End any open step (journaled only when the run completed: a step an exception
        broke off is no step), remove every hook and journal ``run_end`` with the agent's
        last look at the parameters; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self in ATTACHED:
            ATTACHED.remove(self)
        atexit.unregister(self._at_exit)
        remove_backward_listener(self)
        remove_file_listener(self)
        for handle in [*self._handles, *([self._model_hook] if self._model_hook else [])]:
            handle.remove()
        settle_memory_saves()
        try:
            if self._open and self._backward_seen and status == "completed":
                by_hand = self._params is not None and self.agent.optimizer is None
                changed = by_hand and self._params is not None and self._params.changed()
                if changed:
                    self.agent.note_update()
                known = changed or not by_hand or self._params is None or self._params.finite()
                self._finish(update_known=known)
            elif self._open:
                self.agent.end_step()  # undo temporary changes (lr spike, forward hooks)
        finally:
            self._open = self._in_step = self._closure = False
            model = self.agent.model
            extra: dict[str, Any] = {}
            if model is not None:
                extra["params_finite"] = params_finite(model)
            if not self._began:
                extra["no_steps"] = self._why_no_steps()
            self.agent.close(status, reason, **extra)

    def _why_no_steps(self) -> str:
        """Why no training step was found, in the user's words."""
        if self.agent.model is None:
            return (
                "no module ran forward with grad enabled and trainable parameters, no "
                "backward() was called on a tensor and no optimizer stepped"
            )
        name = type(self.agent.model).__name__
        return (
            f"the model ({name}) never ran forward with grad enabled, no backward() was "
            "called on a tensor (torch.autograd.backward() called directly is not seen) and "
            "no optimizer stepped"
        )

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
            self._close_for(exc if exc is not None or not exit_statuses else exit_statuses[-1])

    # -- wiring --------------------------------------------------------------------------

    def begin(self) -> None:
        """Journal ``run_start`` (and ``restart`` when torchrun restarted the workers); learn
        the files earlier attempts saved."""
        model = self.agent.model
        first = next(model.parameters(), None) if model is not None else None
        self.agent.start(0, **({"device": first.device.type} if first is not None else {}))
        if count := self.agent.journal.restart:
            self.agent.claim(Restart(count=count, reason="launcher restarted the workers"))

    def set_model(self, model: nn.Module) -> None:
        """Watch ``model`` (already unwrapped): its forward opens steps, feeds batch faults."""
        if self._model_hook is not None:
            self._model_hook.remove()
        self.agent.model = model
        self._params = ParamSample(model)
        self._model_hook = model.register_forward_pre_hook(ForwardHook(self), with_kwargs=True)

    def hook_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Drive steps from ``optimizer``'s own step hooks."""
        self.agent.optimizer = optimizer
        self._handles.append(optimizer.register_step_pre_hook(StepBeginHook(self)))
        self._handles.append(optimizer.register_step_post_hook(StepEndHook(self)))

    # -- the step --------------------------------------------------------------------------

    def open_step(self) -> None:
        """Begin the next step unless one is open."""
        if self._open or self._closed:
            return
        settle_memory_saves()  # the last step's in-memory saves are in their files by now
        self._open, self._backward_seen = True, False
        self._loss, self._grad_norm, self.backward_calls = None, None, 0
        if self._last is None:
            self._last = time.perf_counter()
        if self._params is not None and self.agent.optimizer is None:
            # Only a trainer with no optimizer can update by hand: sample for it alone.
            self._params.take()
        self._began = True
        self.agent.begin_step(self.agent.step + 1)

    def _boundary(self) -> None:
        """At a forward, a backward or a save: end the open step when its update happened
        (parameters changed) or was given up (gradients cleared, parameters unchanged)."""
        if not self._open or not self._backward_seen or self._in_step or self._closed:
            return
        by_hand = self._params is not None and self.agent.optimizer is None
        if by_hand and self._params is not None and self._params.changed():
            self.agent.note_update()
            self._finish()
        elif self._grads is not None and self._grads.cleared():
            # Weights already non-finite stay NaN whatever an update does: unknown, not skipped.
            known = not by_hand or self._params is None or self._params.finite()
            self._finish(update_known=known)

    def _finish(self, update_known: bool = True) -> None:
        """Journal the open step (its update observed, or not, or unknown) and end it."""
        now = time.perf_counter()
        started = self._last if self._last is not None else now
        self._last = now
        if self._grad_norm is None and self.agent.check_due and self.agent.optimizer is None:
            self._grad_norm = self._norm()
        loss = float(self._loss) if self._loss is not None else math.nan
        lr = self._lr if self._lr is not None else OMIT
        if not update_known:
            self.agent.note_update(known=False)
        identity: dict[str, Any] = {}
        if self._numbering is not None:
            identity, self._numbering = self._numbering.fields(), None
        self.agent.observe_step(
            StepObserved(
                loss=loss,
                grad_norm=self._grad_norm,
                lr=lr,
                step_time=now - started,
                batch_fingerprint=self._batch if self._batch is not None else OMIT,
                **identity,
            )
        )
        self._open = self._in_step = self._backward_seen = self._closure = False
        self._loss = self._lr = self._batch = None
        self.agent.end_step()
        if self.on_first_step is not None:
            callback, self.on_first_step = self.on_first_step, None
            callback()

    def _norm(self) -> float | None:
        optimizer, model = self.agent.optimizer, self.agent.model
        if optimizer is not None:
            return grad_norm(p for g in optimizer.param_groups for p in g["params"])
        return grad_norm(model.parameters()) if model is not None else None

    # -- hook entry points ---------------------------------------------------------------

    def on_forward(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """Model forward: may end the last step, opens the next; batch faults replace the
        first tensor argument (or ``input_ids=``) unless `wrap_batches` feeds them."""
        if self._in_step or self._closed or not torch.is_grad_enabled():
            return None
        self._boundary()
        self._see_batch(args[0] if args else kwargs)
        self.open_step()
        if self._own_batches:
            return None
        if args and isinstance(args[0], torch.Tensor):
            new = self.agent.batch(args[0])
            return None if new is args[0] else ((new, *args[1:]), kwargs)
        new_kwargs = replace_first(kwargs, self.agent.batch)  # input_ids=, when given
        return None if new_kwargs is kwargs else (args, new_kwargs)

    def _see_batch(self, batch: object) -> None:
        """The step opening now (or open, its forward inside a closure) trains on ``batch``:
        its fingerprint; the first step of a process that resumed from a save is numbered by
        it (`harness.inside.step_identity`)."""
        if self._batch is not None:
            return  # a later micro-batch of the same step
        tensor = first_tensor(batch)
        if tensor is None or self._closed:
            return
        self._batch = batch_fingerprint(tensor)
        if self._resumed_from is None or self._numbering is not None:
            return
        earlier = earlier_batches(self.agent.run_dir, self.agent.journal.restart)
        self._numbering = number(self._resumed_from, earlier.get(self._batch, []))
        self._resumed_from = None
        self.agent.step = self._numbering.done + (1 if self._open else 0)

    def before_backward(self, tensor: torch.Tensor) -> None:
        """``tensor.backward()``: may end the last step, opens the next; a scalar is the
        step's loss."""
        if self._in_step or self._closed:
            return
        self._boundary()
        self.open_step()
        self._backward_seen = True
        self.backward_calls += 1
        if tensor.numel() == 1:
            self._loss = tensor.detach()

    def after_backward(self, tensor: torch.Tensor) -> None:
        """Backward returned: journal what gradient faults did; mark the gradients."""
        if not self._open or self._in_step or self._closed:
            return
        self.agent.after_backward()
        if self.agent.check_due:
            self._grad_norm = self._norm()  # before any clipping, as the reference trainer's
        model = self.agent.model
        if model is not None:
            self._grads = GradMark.of(model, self._grads)

    @property
    def closure_open(self) -> bool:
        """True while the closure of the step in progress has not returned."""
        return self._closure

    def on_step_begin(
        self,
        optimizer: torch.optim.Optimizer,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """Optimizer step pre-hook: lr and lr faults; a closure is wrapped, as the step's
        forward and backward run inside it."""
        if optimizer is not self.agent.optimizer or self._in_step or self._closure:
            return None
        if self._closed:
            return None
        kwargs = kwargs or {}
        wrapped = with_closure(args, kwargs, lambda c: Closure(self, c))
        if wrapped is None and not self._open and creates_state(optimizer):
            # No forward, no backward, lr 0 or no gradient: an optimizer stepped to create
            # its state (DCP's get_state_dict on a fresh optimizer), not a training step.
            self._ignored = optimizer
            return None
        self.open_step()
        self._lr = float(optimizer.param_groups[0]["lr"])
        if wrapped is not None:
            self._closure = True
            return wrapped
        self._begin_update()
        return None

    def closure_returned(self) -> None:
        """The step's closure returned: its gradients are in, the update begins."""
        if self._closure:
            self._closure = False
            self._begin_update()

    def _begin_update(self) -> None:
        optimizer = self.agent.optimizer
        self._in_step = True
        if not self._backward_seen:
            self.agent.after_backward()  # gradients came some other way: report faults now
            if self.agent.check_due:
                self._grad_norm = self._norm()
        self._backward_seen = True
        self.agent.before_optimizer_step()
        # With every gradient gone (a guard set them to None) torch.optim changes nothing;
        # after a fault, whether any parameter changed is read whole, before and after.
        self._no_grads = optimizer is not None and has_no_grads(optimizer)
        model = self.agent.model
        faulted = self.agent.injected_this_step and not self._no_grads
        self._before = params_fingerprint(model) if faulted and model is not None else None

    def on_step_end(self, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer step post-hook: weight faults, the `step` event, end-of-step faults."""
        if self._ignored is optimizer:
            self._ignored = None
            return
        if optimizer is not self.agent.optimizer or self._closed:
            return
        self.closure_returned()  # an optimizer that never called its closure
        if not self._in_step:
            return
        updated = not self._no_grads
        model = self.agent.model
        if self._before is not None and model is not None:
            updated = params_fingerprint(model) != self._before
        self._before, self._no_grads = None, False
        self.agent.after_optimizer_step(updated=updated)
        self._finish()
