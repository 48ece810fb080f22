"""tightrope's harness: run, judge and report. Today: the journal every part shares."""

from __future__ import annotations

from harness.errors import JournalError, TightropeError
from harness.journal import Event, Journal, JournalWriter, read_journal

__all__ = ["Event", "Journal", "JournalError", "JournalWriter", "TightropeError", "read_journal"]
__version__ = "0.1.0"
