"""Fault injectors: each a small typed spec plus an injector, in a registry by kind.

`faults` knows torch, numpy and the operating system; it knows nothing of the harness or
the trainer. The harness agent drives injectors through the hooks in `faults.injector`.

The names below load on first use, so importing the errors (which every layer shares)
does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from faults.errors import FaultSpecError, InjectionError, NothingToDamage, TightropeError

if TYPE_CHECKING:
    from faults.injector import Injection, Injector, StepContext
    from faults.plan import FaultPlan
    from faults.registry import build_injector, kinds, parse_fault
    from faults.spec import FAULT_CLASSES, FaultClass, FaultSpec

_LAZY = {
    "Injection": "faults.injector",
    "Injector": "faults.injector",
    "StepContext": "faults.injector",
    "FaultPlan": "faults.plan",
    "build_injector": "faults.registry",
    "kinds": "faults.registry",
    "parse_fault": "faults.registry",
    "FAULT_CLASSES": "faults.spec",
    "FaultClass": "faults.spec",
    "FaultSpec": "faults.spec",
}

__all__ = [
    "FAULT_CLASSES",
    "FaultClass",
    "FaultPlan",
    "FaultSpec",
    "FaultSpecError",
    "Injection",
    "InjectionError",
    "Injector",
    "NothingToDamage",
    "StepContext",
    "TightropeError",
    "build_injector",
    "kinds",
    "parse_fault",
]


def __getattr__(name: str) -> Any:
    """Load a public name on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'faults' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
