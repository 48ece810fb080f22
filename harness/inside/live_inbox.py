"""Live commands reaching one process of a running job (see `harness.live.control`).

Rank 0 reads the inbox, at most every `INBOX_POLL_SECONDS`, and arms each accepted
command for a step every rank can still meet; every rank then takes what rank 0 armed
from the board, checking each entry again. Each command is journaled (`command`),
accepted or refused, and answered. Nothing under ``control/`` can end a step: whatever
goes wrong reading it is journaled as a refused `command` and the step goes on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from faults import FaultSpec
from harness.live.control import Answer, register_pid
from harness.live.control_board import ArmedBoard, ControlChannel
from harness.records.journal import JournalWriter

#: Seconds between two looks at the live-control inbox (rank 0): a command waits at most
#: this long, and a fast loop does not pay a look at every step.
INBOX_POLL_SECONDS = 0.1
#: The id journaled when live control itself failed (not one command).
CONTROL_ID = "control"


class LiveInbox:
    """One process's end of the live-control channel."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, restart: int) -> None:
        self.world_size = world_size
        register_pid(run_dir, rank, os.getpid())
        self.channel = ControlChannel(run_dir, world_size) if rank == 0 else None
        self.board = ArmedBoard(run_dir, restart, world_size)
        self._next_poll = 0.0  # monotonic time of the next look at the inbox
        self._failures: set[str] = set()  # failures journaled already (each once)

    def take(self, step: int, journal: JournalWriter) -> list[FaultSpec]:
        """The faults live commands armed for this process, as of step ``step``; a failure
        of the channel itself is journaled (once per kind of failure) and arms nothing."""
        try:
            return self._take(step, journal)
        except Exception as exc:  # nothing in control/ may end a training step
            reason = f"live control skipped at this step: {type(exc).__name__}: {exc}"
            if reason not in self._failures:
                self._failures.add(reason)
                journal.emit("command", step, id=CONTROL_ID, accepted=False, reason=reason)
            return []

    def _take(self, step: int, journal: JournalWriter) -> list[FaultSpec]:
        published = False
        now = time.monotonic()
        if self.channel is not None and now >= self._next_poll:
            self._next_poll = now + INBOX_POLL_SECONDS
            for received in self.channel.poll():
                if received.fault is None:
                    journal.emit(
                        "command", step, id=received.id, accepted=False, reason=received.reason
                    )
                    self.channel.answer(
                        Answer(received.id, step, accepted=False, reason=received.reason)
                    )
                    continue
                # Another rank may already be one step further: arm no sooner than next step.
                lead = 1 if self.world_size > 1 else 0
                effective = step + max(received.in_steps, lead)
                self.channel.publish(received.id, received.fault, effective, journal.restart)
                published = True
                self.channel.answer(
                    Answer(received.id, step, accepted=True, effective_step=effective)
                )
        if self.world_size == 1 and not published:
            return []  # alone, nothing is armed but what this process just published
        read = self.board.take(step)
        for refused in read.refused:
            journal.emit("command", step, id=refused.id, accepted=False, reason=refused.reason)
        for armed in read.armed:
            journal.emit(
                "command", step, id=armed.id, accepted=True, fault=armed.spec.kind,
                effective_step=armed.step,
            )  # fmt: skip
        return [armed.spec for armed in read.armed]
