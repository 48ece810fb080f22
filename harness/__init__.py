"""tightrope's harness: the journal, the agent (attach, exec, live control), scenario suites, the
runner (local processes or Docker nodes), oracles, scoring and scorecards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.errors import JournalError, TightropeError
from harness.journal import Event, Journal, JournalWriter, read_journal

__all__ = ["Event", "Journal", "JournalError", "JournalWriter", "TightropeError", "read_journal"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from harness.attach import attach as attach


def __getattr__(name: str) -> Any:
    """``harness.attach``, imported on first use (it needs torch)."""
    if name == "attach":
        from harness.attach import attach

        globals()["attach"] = attach  # the function, not the submodule of the same name
        return attach
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
