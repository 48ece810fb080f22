"""tightrope's harness: the journal, the agent (attach, exec, live control), scenario suites, the
runner (local processes or Docker nodes), oracles, scoring and scorecards."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.errors import JournalError, TightropeError
from harness.records.journal import Event, Journal, JournalWriter, read_journal

__all__ = ["Event", "Journal", "JournalError", "JournalWriter", "TightropeError", "read_journal"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from harness.inside.attach import attach as attach
    from harness.inside.attach import claim as claim


def __getattr__(name: str) -> Any:
    """``harness.attach`` and ``harness.claim``, imported on first use (they need torch)."""
    if name in ("attach", "claim"):
        # From the module `harness.inside.attach`; cached here as the functions.
        module = importlib.import_module("harness.inside.attach")
        value = getattr(module, name)
        globals()[name] = value  # the function, not the submodule of the same name
        return value
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
