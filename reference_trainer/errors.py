"""Errors of the reference trainer; the CLI turns each into a one-line message and exit 2
(bad input, nothing on disk changed), or exit 1 for a `TrainingFailed` (training had
started)."""

from __future__ import annotations

from harness.errors import TightropeError


class ConfigError(TightropeError):
    """A configuration value or command-line argument is out of range."""


class RunDirError(TightropeError):
    """The run directory does not hold what the command needs (or holds a run already)."""


class CheckpointError(TightropeError):
    """A checkpoint is missing, unreadable or does not match the run."""


class TrainingFailed(TightropeError):
    """Training had started (the run directory changed) when this went wrong: not bad
    input, so the CLI exits 1."""


class SaveError(CheckpointError, TrainingFailed):
    """A checkpoint could not be written: disk full, file too large, ... (named in words)."""
