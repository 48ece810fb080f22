"""Fault injectors: each a small typed spec plus an injector, in a registry by kind.

`faults` knows torch, numpy and the operating system; it knows nothing of the harness or
the trainer. The harness agent drives injectors through the hooks in `faults.injector`.
"""

from __future__ import annotations

from faults.errors import FaultSpecError, InjectionError, TightropeError
from faults.injector import Injection, Injector, StepContext
from faults.plan import FaultPlan
from faults.registry import build_injector, kinds, parse_fault
from faults.spec import FaultSpec

__all__ = [
    "FaultPlan",
    "FaultSpec",
    "FaultSpecError",
    "Injection",
    "InjectionError",
    "Injector",
    "StepContext",
    "TightropeError",
    "build_injector",
    "kinds",
    "parse_fault",
]
