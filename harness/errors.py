"""Errors of the harness; the root `TightropeError` is shared with faults/ and the trainer."""

from __future__ import annotations

from faults.errors import TightropeError

__all__ = ["JournalError", "TightropeError"]


class JournalError(TightropeError):
    """A journal could not be written or read as the contract requires."""
