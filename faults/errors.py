"""The root of every error tightrope raises on purpose, and the fault package's own.

The root lives here, in the lowest layer, so that faults, harness and the reference
trainer all share it without any import running against the dependency direction.
"""

from __future__ import annotations


class TightropeError(Exception):
    """Base class: the message names the file, field or step and what was expected."""


class FaultSpecError(TightropeError):
    """A fault specification or plan is invalid; the message names the dotted field."""


class InjectionError(TightropeError):
    """A fault could not be applied to its target (missing file, process or parameter)."""


class NothingToDamage(InjectionError):
    """A checkpoint fault found nothing to act on at its step: no checkpoint yet, none
    older than the latest, the file already gone or empty. The run's state, not the plan,
    is why; the agent journals ``fault_skipped`` and training goes on (the fault counts
    as fired, so a restarted job does not meet it again)."""
