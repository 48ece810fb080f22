"""A crash point's verdict, from what tightrope observed of its crash run and its resume.

The rules, in order (ckpt-chaos's four verdicts, with the same meaning):

1. HARD_FAIL: the resume exited non-zero or ran past its deadline: the job is down until
   someone cleans up.
2. SILENT_DIVERGENCE: it finished, but the run's parameters after some step (the agent's
   fingerprint) differ from the fault-free run's at that step, or the run did not reach
   the last step, or its ranks disagree: nothing says it is no longer the same run.
3. LOST_WORK: it resumed from an older step than the newest save that was complete on disk
   at the kill (every file of it put in place by an event the crash run got past, at the
   size the fault-free run left it).
4. PASS otherwise.

Divergence is judged before lost work so a bad resume never hides behind a lenient rule.
A resume with no fingerprint to compare is not a pass: it counts as divergence ("no
evidence"), since its final state is unknown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

VERDICTS = ("PASS", "HARD_FAIL", "SILENT_DIVERGENCE", "LOST_WORK")


@dataclass(slots=True)
class Outcome:
    """What tightrope saw of one point (its ``evidence`` in crashpoints.json)."""

    #: The crash run's exit code (None: stopped by tightrope after the grace period).
    crash_exit: int | None
    #: The point's rank died at the point (its hook said so before the kill).
    killed: bool
    #: The crash run met the fault-free run's event at that number (same op and path).
    event_matched: bool
    resume_exit: int | None
    resume_timed_out: bool
    #: The newest save complete on disk at the kill (None: none).
    newest_complete: int | None
    #: The last step trained before the kill.
    killed_after_step: int | None
    #: The step the resume went on from (the one before the first it trained; the last step
    #: when it had nothing left to train); None when it trained nothing and the run had not
    #: reached the end.
    resumed_from: int | None
    #: The first step whose fingerprint differs from the fault-free run's (any rank).
    first_difference: int | None
    #: The last step the run reached, and whether every rank's parameters after it are the
    #: fault-free run's.
    final_step: int | None
    final_matches: bool
    #: Steps compared by fingerprint after the kill.
    steps_compared: int = 0
    #: What the resume loaded, as journaled (the agent's `file_loaded` observations; the
    #: reference trainer's `checkpoint_loaded`).
    loads: list[dict[str, Any]] = field(default_factory=list)
    #: A torn point: the file's size whole and after the cut.
    torn: dict[str, Any] | None = None

    @property
    def steps_redone(self) -> int | None:
        """Steps trained before the kill that the resume trained again."""
        if self.killed_after_step is None or self.resumed_from is None:
            return None
        return max(0, self.killed_after_step - self.resumed_from)

    @property
    def steps_lost(self) -> int | None:
        """Steps of the newest complete save the resume did not go on from."""
        if self.newest_complete is None or self.resumed_from is None:
            return None
        return max(0, self.newest_complete - self.resumed_from)

    def document(self) -> dict[str, Any]:
        """The ``evidence`` object of crashpoints.json."""
        out = asdict(self)
        out["steps_redone"] = self.steps_redone
        out["steps_lost"] = self.steps_lost
        return out


def classify(o: Outcome) -> tuple[str, str]:
    """The verdict and why, in words."""
    if o.resume_timed_out:
        return "HARD_FAIL", "the resume ran past its deadline"
    if o.resume_exit != 0:
        return "HARD_FAIL", f"the resume exited with {o.resume_exit}"
    if o.first_difference is not None:
        return "SILENT_DIVERGENCE", f"parameters differ from step {o.first_difference}"
    if not o.final_matches:
        if o.final_step is None:
            return "SILENT_DIVERGENCE", "no fingerprint of the final parameters (no evidence)"
        return (
            "SILENT_DIVERGENCE",
            f"the run ended at step {o.final_step}, not the fault-free run's",
        )
    lost = o.steps_lost
    if lost:
        return "LOST_WORK", (
            f"resumed from step {o.resumed_from}, the save at step {o.newest_complete} was complete"
        )
    return "PASS", "resumed to the fault-free run's final parameters"
