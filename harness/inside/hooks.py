"""The agent's hooks in a foreign trainer, made so that they leave no trace in it.

``torch.Tensor.backward`` is wrapped while anything listens. The model's forward pre-hook
and the optimizer's step hooks are small objects that copy (``copy.deepcopy``) and pickle
as `Inert`, a hook that does nothing, and `strip_hooks` takes them off a module while it is
saved, so a trainer's EMA copy has no agent and its files hold nothing of tightrope.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from faults.injector import Inert, InertCopies, StepContext
from faults.numeric import OutputScaler

if TYPE_CHECKING:
    from faults import Injector


class HasContext(Protocol):
    """What a gradient hook asks of the agent (`harness.inside.agent.Agent`)."""

    def context(self) -> StepContext:
        """What injectors may touch now."""
        ...


class HasModel(Protocol):
    """An agent with the model it watches."""

    @property
    def model(self) -> nn.Module | None:
        """The model, once known."""
        ...


class StepHooks(Protocol):
    """What the model's and the optimizer's hooks call: the attached agent
    (`harness.inside.attached_agent.AttachedAgent`)."""

    @property
    def agent(self) -> HasModel:
        """The agent it drives."""
        ...

    @property
    def closure_open(self) -> bool:
        """True inside ``optimizer.step`` until its closure returned."""
        ...

    def on_forward(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The model runs forward."""
        ...

    def on_step_begin(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """``optimizer.step`` is about to run."""
        ...

    def on_step_end(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step`` returned."""
        ...

    def closure_returned(self) -> None:
        """The step's closure returned."""
        ...


class GradientHook(InertCopies):
    """A post-accumulate-grad hook that hands one parameter's gradient to a fault.

    Copies of the model (``copy.deepcopy``, pickling) get no agent: the hook copies and
    pickles as nothing that acts."""

    def __init__(self, agent: HasContext, injector: Injector[Any], name: str) -> None:
        self.agent, self.injector, self.name = agent, injector, name

    def __call__(self, param: torch.Tensor) -> None:
        if param.grad is not None:
            self.injector.on_gradient(self.agent.context(), self.name, param.grad)


# -- torch.Tensor.backward, wrapped while anything listens --------------------------------


class BackwardListener(Protocol):
    """Told of every ``tensor.backward()``: just before it runs, and once it returned."""

    def before_backward(self, tensor: torch.Tensor) -> None:
        """``tensor.backward()`` is about to run."""

    def after_backward(self, tensor: torch.Tensor) -> None:
        """It returned: the gradients of this backward are accumulated (and all-reduced)."""


_listeners: list[BackwardListener] = []
_original_backward: Callable[..., Any] | None = None


def add_backward_listener(listener: BackwardListener) -> None:
    """Tell ``listener`` of every ``tensor.backward()`` (wraps it on first use)."""
    global _original_backward
    if _original_backward is None:
        original: Callable[..., Any] = torch.Tensor.backward

        @functools.wraps(original)
        def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            listening = tuple(_listeners)
            for each in listening:
                each.before_backward(self)
            result = original(self, *args, **kwargs)
            for each in listening:
                each.after_backward(self)
            return result

        _original_backward = original
        setattr(torch.Tensor, "backward", backward)  # noqa: B010 - mypy refuses a method assign
    _listeners.append(listener)


def remove_backward_listener(listener: BackwardListener) -> None:
    """Stop telling ``listener``; the original ``backward`` comes back with the last one."""
    global _original_backward
    if listener in _listeners:
        _listeners.remove(listener)
    if not _listeners and _original_backward is not None:
        setattr(torch.Tensor, "backward", _original_backward)  # noqa: B010
        _original_backward = None


class ForwardHook(InertCopies):
    """The model's forward pre-hook. A copy of the model (``copy.deepcopy``, pickling)
    gets no agent: the hook copies as one that does nothing, and saves strip it."""

    def __init__(self, attached: StepHooks) -> None:
        self.attached = attached

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if module is not self.attached.agent.model:
            return None
        return self.attached.on_forward(module, args, kwargs)


class StepBeginHook(InertCopies):
    """An optimizer step pre-hook (it may wrap the step's closure)."""

    def __init__(self, attached: StepHooks) -> None:
        self.attached = attached

    def __call__(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        return self.attached.on_step_begin(optimizer, args, kwargs)


class StepEndHook(InertCopies):
    """An optimizer step post-hook."""

    def __init__(self, attached: StepHooks) -> None:
        self.attached = attached

    def __call__(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.attached.on_step_end(optimizer)


class Closure:
    """The closure handed to ``optimizer.step(closure)`` (Lightning's steps, LBFGS), wrapped:
    the forward and backward it runs belong to the step, and the update starts when it
    returns. A closure called again within the same step (LBFGS) runs as it is."""

    def __init__(self, attached: StepHooks, closure: Callable[[], Any]) -> None:
        self.attached, self.closure = attached, closure

    def __call__(self) -> Any:
        if not self.attached.closure_open:
            return self.closure()
        result = self.closure()
        self.attached.closure_returned()
        return result


def with_closure(
    args: tuple[Any, ...], kwargs: dict[str, Any], wrap: Callable[[Callable[[], Any]], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """``optimizer.step``'s arguments (``args[0]`` is the optimizer itself, as its step
    hooks receive them) with the closure wrapped; None when it has none."""
    if len(args) > 1 and callable(args[1]):
        return (args[0], wrap(args[1]), *args[2:]), kwargs
    if callable(kwargs.get("closure")):
        return args, {**kwargs, "closure": wrap(kwargs["closure"])}
    return None


class OutputHook(InertCopies):
    """The microscope's forward hook on one layer's module: hands its output to ``see``
    with the layer's index."""

    def __init__(self, see: Callable[[int, Any], None], index: int) -> None:
        self.see, self.index = see, index

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        self.see(self.index, output)


#: What `strip_hooks` takes off a module while it is saved: (hook table, hook classes).
_OURS = (
    ("_forward_pre_hooks", (ForwardHook, Inert)),
    ("_forward_hooks", (OutputHook, OutputScaler, Inert)),
)


def strip_hooks(obj: object) -> Callable[[], None]:
    """Take the agent's and the microscope's hooks (and inert copies of them) off every
    module in ``obj`` (a module, or a dict, list or tuple holding modules); returns what
    puts them back, each table whole and in its old order (a trainer's own hooks may
    depend on running first)."""
    modules = [obj] if isinstance(obj, nn.Module) else []
    if isinstance(obj, dict):
        modules = [v for v in obj.values() if isinstance(v, nn.Module)]
    elif isinstance(obj, (list, tuple)):
        modules = [v for v in obj if isinstance(v, nn.Module)]
    taken: list[tuple[dict[int, Any], list[tuple[int, Any]]]] = []
    for root in modules:
        for module in root.modules():
            for table, ours in _OURS:
                hooks = getattr(module, table)
                if any(isinstance(hook, ours) for hook in hooks.values()):
                    taken.append((hooks, list(hooks.items())))
                    for key, hook in list(hooks.items()):
                        if isinstance(hook, ours):
                            del hooks[key]

    def restore() -> None:
        for hooks, items in taken:
            hooks.clear()
            hooks.update(items)

    return restore
