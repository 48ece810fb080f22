"""``crashpoints:`` in a scenario: a crash-point exploration (`tightrope crashpoints`, see
docs/crashpoints.md) held by a suite, so that a suite run and pytest run it and judge it.

A scenario with this block has no ``trainer``, ``faults`` or ``expect``: the block names
the job's command, its resume, how many points and ranks, and the verdicts that fail it.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: The verdicts of a crash point, in the order they are checked (as `harness.crashpoints`).
CRASH_VERDICTS = ("HARD_FAIL", "SILENT_DIVERGENCE", "LOST_WORK", "PASS")
#: The verdicts that fail a scenario unless ``fail_on`` says otherwise (the CLI's default).
DEFAULT_FAIL_ON = ("HARD_FAIL", "SILENT_DIVERGENCE")
#: Seconds the other ranks go on after one dies, and a run's limit (the CLI's defaults too).
DEFAULT_GRACE, DEFAULT_TIMEOUT = 3.0, 600.0
RUN_DIR = "{run_dir}"


def _argv(command: str, where: str) -> list[str]:
    """``command`` split, ``{python}`` filled; ``{run_dir}`` is kept for each run."""
    try:
        argv = shlex.split(command.replace("{python}", sys.executable))
    except ValueError as exc:
        raise ValueError(f"{where} cannot be split: {exc}") from None
    if not argv:
        raise ValueError(f"{where} is empty")
    if not any(RUN_DIR in word for word in argv):
        raise ValueError(f"{where} has no {RUN_DIR}: put it where the job takes its run dir")
    return argv


class CrashpointsSpec(BaseModel):
    """A crash-point exploration: kill the job at every file event of its saves, resume it,
    classify each point."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str = Field(
        description="The training command; {run_dir} is where it writes, {python} the "
        "interpreter tightrope runs on. It runs through the agent's bootstrap."
    )
    resume_command: str | None = Field(
        default=None, description="How the job restarts (default: the command again)."
    )
    max_points: int | None = Field(
        default=None, ge=1, description="Run an even sample of at most this many points."
    )
    ranks: int = Field(
        default=1, ge=1, le=64, description="Ranks the command starts itself (its torchrun)."
    )
    fail_on: list[str] = Field(
        default=list(DEFAULT_FAIL_ON),
        description="Verdicts that fail the scenario (any case).",
    )
    cores: int = Field(default=1, ge=1, le=1024, description="Points run at once x ranks.")
    grace: float = Field(
        default=DEFAULT_GRACE, gt=0, description="Seconds the other ranks go on after one dies."
    )
    timeout: float = Field(
        default=DEFAULT_TIMEOUT,
        gt=0,
        description="A run past this is killed; a resume past it fails.",
    )

    @field_validator("command")
    @classmethod
    def _command(cls, value: str) -> str:
        _argv(value, "crashpoints.command")
        return value

    @field_validator("resume_command")
    @classmethod
    def _resume(cls, value: str | None) -> str | None:
        if value is not None:
            _argv(value, "crashpoints.resume_command")
        return value

    @field_validator("fail_on", mode="before")
    @classmethod
    def _verdicts(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [w for w in value.split(",") if w.strip()]
        if not isinstance(value, list):
            return value  # pydantic names the type
        words = [str(w).strip().upper() for w in value]
        wrong = [w for w in words if w not in CRASH_VERDICTS]
        if wrong:
            raise ValueError(
                f"unknown verdict {', '.join(wrong)}; choose from {', '.join(CRASH_VERDICTS)}"
            )
        return words

    def train_argv(self) -> list[str]:
        """The training command as argv (``{run_dir}`` still in it)."""
        return _argv(self.command, "crashpoints.command")

    def resume_argv(self) -> list[str]:
        """The resume command as argv: ``resume_command``, else the command again."""
        if self.resume_command is None:
            return self.train_argv()
        return _argv(self.resume_command, "crashpoints.resume_command")
