"""tightrope's harness: the journal, the agent (attach, exec, live control), scenario suites, the
runner (local processes or Docker nodes), oracles, scoring and scorecards."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.errors import JournalError, TightropeError

__all__ = ["Event", "Journal", "JournalError", "JournalWriter", "TightropeError", "read_journal"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from harness.inside.attach import attach as attach
    from harness.inside.attach import claim as claim
    from harness.records.journal import Event, Journal, JournalWriter, read_journal

#: Imported on first use: the journal's names (a process that imports any of harness, as
#: each rank's hang monitor does, need not load the journal's event types), and
#: ``harness.attach`` and ``harness.claim`` (they need torch).
_LAZY = {
    "Event": "harness.records.journal",
    "Journal": "harness.records.journal",
    "JournalWriter": "harness.records.journal",
    "read_journal": "harness.records.journal",
    "attach": "harness.inside.attach",
    "claim": "harness.inside.attach",
}


def __getattr__(name: str) -> Any:
    """The names of `_LAZY`, imported on first use."""
    if name in _LAZY:
        # Cached here as the object itself (for attach: the function, not the submodule).
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
