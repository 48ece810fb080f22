"""Errors of the reference trainer; the CLI turns each into a one-line message and exit 2."""

from __future__ import annotations

from harness.errors import TightropeError


class ConfigError(TightropeError):
    """A configuration value or command-line argument is out of range."""


class RunDirError(TightropeError):
    """The run directory does not hold what the command needs (or holds a run already)."""


class CheckpointError(TightropeError):
    """A checkpoint is missing, unreadable or does not match the run."""
