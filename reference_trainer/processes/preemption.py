"""Preemption: SIGTERM asks for an emergency checkpoint, then a clean exit.

A scheduler that takes a node back sends SIGTERM and, after a grace period, SIGKILL.
The handler only raises a flag; the training loop reads it at the next step boundary,
where every rank learns of it in the step's one agreement collective (a single rank
may have been signalled), saves a checkpoint of that step on every rank, waits for it
to be durable and exits with `EXIT_PREEMPTED`. The restarted job resumes from that
checkpoint, so no finished step is lost. With the mechanism off, SIGTERM keeps its
default meaning: the process dies at once.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

from harness.inside.agent import Agent
from harness.records.events import Detected, Recovered

#: Exit status of a rank that stopped for a preemption (128 + SIGTERM, as shells report it).
EXIT_PREEMPTED = 143


class Preemption:
    """The SIGTERM flag of one process."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.received_at: float | None = None
        self._previous: Any = None

    @property
    def requested(self) -> bool:
        """A SIGTERM arrived."""
        return self.received_at is not None

    def install(self) -> None:
        """Catch SIGTERM (main thread only; elsewhere the default stays)."""
        if self.enabled and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)

    def uninstall(self) -> None:
        """Give SIGTERM its previous handler back."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()


def journal_preemption(agent: Agent, preemption: Preemption, step: int) -> str:
    """Journal a preemption and its emergency checkpoint; the run's end reason."""
    since = preemption.received_at
    waited = time.monotonic() - since if since is not None else None
    here = "here" if preemption.requested else "on another rank"
    agent.claim(Detected(detector="preemption", details={"signal": "SIGTERM", "received": here}))
    agent.claim(
        Recovered(
            action="emergency_checkpoint", details={"step": step, "seconds_after_signal": waited}
        )
    )
    return f"preempted (SIGTERM): emergency checkpoint at step {step}"
