"""What every loss-spike detector shares: the claim it makes, the protocol it follows, and
the helpers that name config fields and check saved states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

NAMES = ("robust_zscore", "early_max", "forecast")
PREFIX = "stability.spikes"
#: Which side of its expected range a loss fell: the forecaster's band has two.
Side = Literal["above", "below"]
SIDES: tuple[Side, ...] = ("above", "below")


@dataclass(frozen=True, slots=True)
class SpikeClaim:
    """One detector firing at one step, with the figures that made it fire."""

    detector: str
    step: int
    loss: float
    details: dict[str, float]
    side: Side | None = None
    """Where the loss fell, for a detector with a two-sided band; None for the others
    (they fire above only) and for a non-finite loss."""

    def journal_details(self) -> dict[str, float | str]:
        """The details as journaled: the figures, and the side when there is one."""
        side: dict[str, float | str] = {} if self.side is None else {"side": self.side}
        return {**self.details, **side}


@runtime_checkable
class LossSpikeDetector(Protocol):
    """What every detector offers."""

    name: str

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Take this step's loss; a claim when the detector fires at this step."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly after `load_state_dict`."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`."""

    def reset(self) -> None:
        """Forget all history."""


def check(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{PREFIX}.{name} must be {rule}, got {value!r}")


def claim(
    name: str, step: int, loss: float, *, side: Side | None = None, **details: float
) -> SpikeClaim:
    figures = {k: float(v) for k, v in details.items()}
    return SpikeClaim(name, step, float(loss), figures, side)


def same_detector(name: str, state: dict[str, Any]) -> None:
    if state.get("detector") != name:
        raise ValueError(f"state of detector {state.get('detector')!r} given to {name!r}")
