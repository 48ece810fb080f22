"""Out of memory: an allocation in the forward pass that the allocator refuses.

The fault hooks the matching modules before the step's forward pass; the first of them to
run asks the allocator of its output's device for more memory than the device has (on
CUDA twice its total memory, so the caching allocator raises ``torch.OutOfMemoryError``
with its own report; elsewhere 2**60 bytes, past any address space). The failure is the
allocator's, at an allocation inside the forward pass, where a real one happens.

On the CPU, PyTorch 2.13's allocator raises a ``RuntimeError`` ("DefaultCPUAllocator:
can't allocate memory"), not ``torch.OutOfMemoryError``; the fault raises it again as
``MemoryError``, Python's out-of-memory type, with the allocator's error as its cause and
message, so that a trainer's OOM handling (``except (torch.OutOfMemoryError,
MemoryError)``) is what meets it.

The record (journaled before the forward pass, naming the rank and the modules) says
the allocation is armed; the hooks go at the step's end whether or not they fired.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.hooks import RemovableHandle
else:
    from faults.lazy_torch import nn, torch

from faults.gradient import no_match
from faults.injector import (
    InertCopies,
    Injection,
    Injector,
    StepContext,
    matching_modules,
    require_model,
)
from faults.spec import FaultClass, FaultSpec

#: Bytes asked for on a device whose size is not known: past any 64-bit address space.
BEYOND_ANY = 1 << 60


class OomSpec(FaultSpec):
    """Fail an allocation in the forward pass of a matching module on the target ranks."""

    fault_class: ClassVar[FaultClass] = "process"
    kind: Literal["oom"] = "oom"
    description: ClassVar[str] = (
        "An allocation in the forward pass fails: OutOfMemoryError (CUDA), MemoryError (CPU)."
    )
    target: str = Field(
        default="*", min_length=1, description="Glob of the modules whose forward pass allocates."
    )


def too_much(device: torch.device) -> int:
    """More bytes than ``device`` holds."""
    if device.type == "cuda":
        return 2 * int(torch.cuda.get_device_properties(device).total_memory)
    return BEYOND_ANY


def fail_allocation(device: torch.device) -> None:
    """Ask ``device``'s allocator for more than it has; raises what it raises
    (MemoryError on the CPU, see the module doc)."""
    size = too_much(device)
    try:
        torch.empty(size, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as exc:
        if device.type != "cpu":
            raise
        raise MemoryError(str(exc)) from exc
    raise MemoryError(f"oom: the allocator granted {size} bytes on {device}")  # never seen


class FailingAllocation(InertCopies):
    """The forward hook: the first call on this rank allocates too much (a copy of the
    model gets a hook that does nothing)."""

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.fired:
            return
        self.fired = True
        device = output.device if isinstance(output, torch.Tensor) else _device_of(module)
        fail_allocation(device)


def _device_of(module: nn.Module) -> torch.device:
    for param in module.parameters():
        return param.device
    return torch.device("cpu")


class OomInjector(Injector[OomSpec]):
    """Forward hooks installed before the forward pass, removed when the step ends."""

    def __init__(self, spec: OomSpec) -> None:
        super().__init__(spec)
        self._handles: list[RemovableHandle] = []

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        spec = self.spec
        if ctx.rank not in spec.target_ranks(ctx.world_size):
            return []
        model = require_model(ctx, spec.kind)
        modules = [(name, m) for name, m in matching_modules(model, spec.target)]
        if not modules:
            names = [name for name, _ in model.named_modules() if name]
            raise no_match(spec.kind, "module", spec.target, names)
        self._remove()
        hook = FailingAllocation()
        for _, module in modules:
            self._handles.append(module.register_forward_hook(hook))
        details = {
            "rank": ctx.rank,
            "pid": os.getpid(),
            "modules": len(modules),
            "first": modules[0][0],
            "bytes": too_much(_device_of(model)),
        }
        return [Injection(fault=spec.kind, target=f"rank {ctx.rank}", details=details)]

    def end_step(self, ctx: StepContext) -> list[Injection]:
        self._remove()
        return []

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
