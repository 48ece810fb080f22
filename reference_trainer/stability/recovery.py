"""The three-level recovery policy: decide what to do when training fails or diverges.

    level 1  roll back to the latest valid checkpoint
    level 2  roll back to the checkpoint before it and lower the learning rate by 20%
             (skipping the data that preceded the failure too is an option, `skip_data`)
    level 3  roll back at least `retry_steps` steps, retry them in fp32, then return to
             the configured precision
    then     stop cleanly with a written diagnosis (never loop forever)

A new failure within `escalation_window` good steps of the last recovery climbs one
level; a run that stays healthy that long starts again from level 1. A collapsed fp16
loss scale goes straight to level 3. The policy only decides; the trainer acts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reference_trainer.errors import ConfigError

ACTIONS = {1: "rollback", 2: "rollback_lower_lr", 3: "fp32_retry", 4: "give_up"}


@dataclass(kw_only=True, slots=True)
class RecoveryConfig:
    """When and how the trainer recovers."""

    enabled: bool = True
    """Off: failures are still detected and journaled, but nothing is done about them."""
    max_consecutive_skips: int = 3
    """Non-finite steps skipped in a row before the skips become a failure."""
    escalation_window: int = 30
    """Good steps after a recovery before the level resets."""
    lr_backoff: float = 0.8
    """Level 2 multiplies the learning rate by this."""
    skip_data: bool = False
    """Level 2 also skips the data the failed steps trained on (off: the same data again)."""
    retry_steps: int = 100
    """Level 3 rolls back at least this many steps and retries them in fp32; checkpoint
    retention keeps one checkpoint at least this far back."""
    max_recoveries: int = 20
    """Recoveries in one process before giving up whatever the level (a last backstop)."""

    def __post_init__(self) -> None:
        for name in ("max_consecutive_skips", "escalation_window", "retry_steps", "max_recoveries"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"stability.recovery.{name} must be >= 1, got {getattr(self, name)}"
                )
        if not 0 < self.lr_backoff < 1:
            raise ConfigError(
                f"stability.recovery.lr_backoff must be in (0, 1), got {self.lr_backoff}"
            )


@dataclass(frozen=True, slots=True)
class Failure:
    """Why recovery is needed: the step, the reason, and the figures behind it."""

    step: int
    reason: str  # "non_finite_steps", "loss_spike", "loss_scale_collapsed", ...
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the trainer must do now."""

    level: int
    action: str
    failure: Failure


@dataclass(slots=True)
class RecoveryPolicy:
    """Climbs the levels as failures repeat; remembers its history for the diagnosis."""

    config: RecoveryConfig
    level: int = 0
    good_steps: int = 0
    history: list[Decision] = field(default_factory=list)

    def good_step(self) -> None:
        """A step trained without failure; enough of them reset the level."""
        self.good_steps += 1
        if self.level and self.good_steps >= self.config.escalation_window:
            self.level = 0

    def decide(self, failure: Failure) -> Decision:
        """The next action for ``failure``."""
        floor = 3 if failure.reason == "loss_scale_collapsed" else 1
        if len(self.history) >= self.config.max_recoveries:
            floor = 4
        self.level = min(max(self.level + 1, floor), 4)
        self.good_steps = 0
        decision = Decision(self.level, ACTIONS[self.level], failure)
        self.history.append(decision)
        return decision

    def state_dict(self) -> dict[str, Any]:
        """Level and counters (the history lives in the journal)."""
        return {"level": self.level, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""
        self.level = int(state["level"])
        self.good_steps = int(state["good_steps"])

    def diagnosis(self) -> str:
        """A human-readable account of every failure and what was tried."""
        lines = ["# Training stopped: recovery exhausted", ""]
        lines.append("Every level of the recovery policy was tried and the run still failed.")
        lines.append("")
        lines.append("| step | failure | level | action | figures |")
        lines.append("|---|---|---|---|---|")
        for d in self.history:
            figures = ", ".join(f"{k}={v}" for k, v in d.failure.details.items())
            lines.append(
                f"| {d.failure.step} | {d.failure.reason} | {d.level} | {d.action} | {figures} |"
            )
        lines.append("")
        last = self.history[-1].failure if self.history else None
        if last is not None:
            lines.append(f"Last failure: {last.reason} at step {last.step}.")
        return "\n".join(lines) + "\n"
