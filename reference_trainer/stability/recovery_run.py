"""Carrying out the recovery policy's decisions: roll back to a checkpoint (the latest valid
one, the one before it with a lower learning rate and the failing data skipped, or one far
enough back to retry in fp32), or give up with a diagnosis. The policy
(`reference_trainer.stability.recovery`) decides; this module acts and journals the claims.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from harness.inside.agent import Agent
from harness.records.events import Detected, Recovered
from reference_trainer.checkpoints import files as ckpt
from reference_trainer.checkpoints.manager import CheckpointManager
from reference_trainer.errors import CheckpointError
from reference_trainer.stability.layer_diagnosis import DiagnosisReport
from reference_trainer.stability.recovery import Decision, Failure, RecoveryPolicy
from reference_trainer.stream.batching import PackedStream
from reference_trainer.stream.data import TokenStream

State = dict[str, Any]


class Rewindable(Protocol):
    """What recovery changes of the trainer besides its state: the learning rate's scale,
    the data position, the precision."""

    lr_scale: float

    @property
    def stream(self) -> TokenStream | PackedStream:
        """The token stream the loader draws from."""
        ...

    def force_fp32(self, until: int) -> None:
        """Train in fp32 up to step ``until``."""
        ...


class RecoveryRun:
    """Acts on the decisions of one process's recovery policy."""

    def __init__(
        self,
        policy: RecoveryPolicy,
        checkpoints: CheckpointManager,
        trainer: Rewindable,
        *,
        restore: Callable[[Path, State], int],
        agent: Agent,
        diagnosis: DiagnosisReport | None,
        say: Callable[[str], None],
        lr_backoff: float,
        skip_data: bool,
        retry_steps: int,
        windows_per_step: int,
    ) -> None:
        self.policy, self.checkpoints, self.trainer = policy, checkpoints, trainer
        self.restore, self.agent, self.say = restore, agent, say
        #: Where rank 0 writes why it gave up (None on the other ranks).
        self.diagnosis = diagnosis
        self.lr_backoff, self.skip_data, self.retry_steps = lr_backoff, skip_data, retry_steps
        self.windows_per_step = windows_per_step

    def recover_or_give_up(self, failure: Failure) -> int | None:
        """Climb the policy's levels until one works; the step training continues after,
        or None when all are exhausted."""
        while True:
            decision = self.policy.decide(failure)
            if decision.action == "give_up":
                self._give_up(decision)
                return None
            try:
                return self._recover(decision)
            except CheckpointError as exc:  # nothing to roll back to at this level
                details = {"level": decision.level, "reason": str(exc)}
                self.agent.claim(Detected(detector="recovery_failed", details=details))

    def _recover(self, decision: Decision) -> int:
        """Carry out a recovery decision; returns the step training continues after."""
        failure = decision.failure
        if decision.level == 1:
            path, state = self.checkpoints.load_valid()
        elif decision.level == 2:
            path, state = self._older_or_latest()
        else:
            floor = max(failure.step - self.retry_steps, 0)
            try:
                path, state = self.checkpoints.load_valid(at_most_step=floor)
            except CheckpointError:  # nothing that old: the oldest valid one will do
                path, state = self._oldest_valid()
        step = self.restore(path, state)
        details: dict[str, Any] = {
            "level": decision.level,
            "failure": failure.reason,
            "failed_at": failure.step,
            "checkpoint": path.name,
            "resumed_at": step,
        }
        if decision.level == 2:
            self.trainer.lr_scale *= self.lr_backoff
            details["lr_scale"] = self.trainer.lr_scale
            if self.skip_data:
                windows = (failure.step - step) * self.windows_per_step
                self.trainer.stream.skip(windows)
                details["skipped_windows"] = windows
        if decision.level >= 3:
            # fp32 for the steps being retried, up to the one that failed; then back.
            self.trainer.force_fp32(until=failure.step)
            details |= {"precision": "fp32", "fp32_until": failure.step}
        self.agent.claim(Recovered(action=decision.action, details=details))
        self.say(
            f"recovery level {decision.level} ({decision.action}): "
            f"{failure.reason} at step {failure.step}, resuming after step {step}"
        )
        return step

    def _older_or_latest(self) -> tuple[Path, State]:
        try:
            return self.checkpoints.load_valid(skip=1)
        except CheckpointError:
            return self.checkpoints.load_valid()

    def _oldest_valid(self) -> tuple[Path, State]:
        valid = ckpt.complete_checkpoints(self.checkpoints.run_dir)
        if not valid:
            return self.checkpoints.load_valid()
        return self.checkpoints.load_valid(at_most_step=ckpt.checkpoint_step(valid[0]))

    def _give_up(self, decision: Decision) -> None:
        if self.diagnosis is not None:
            self.diagnosis.gave_up(self.policy.diagnosis())
        details = {"failure": decision.failure.reason, "step": decision.failure.step}
        self.agent.claim(Detected(detector="recovery_exhausted", details=details))
        where = f"; diagnosis in {self.diagnosis.path}" if self.diagnosis is not None else ""
        self.say(f"recovery exhausted at step {decision.failure.step}{where}")
