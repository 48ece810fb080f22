"""The root of every error tightrope raises on purpose."""

from __future__ import annotations


class TightropeError(Exception):
    """Base class: the message names the file, field or step and what was expected."""


class JournalError(TightropeError):
    """A journal could not be written or read as the contract requires."""
