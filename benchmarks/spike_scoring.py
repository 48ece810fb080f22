"""Scoring a loss-spike detector's firings against labelled spikes.

A labelled spike has an onset: the first step whose loss the fault can raise (the faulty
batch's own step; the step after a learning-rate spike, whose update shows in the next
loss). It counts as detected when the detector fires within ``window`` steps from its onset
(``onset <= step <= onset + window``); the delay is the first such firing's step less the
onset. Further firings inside the window, and firings up to ``aftermath`` steps after a
detected spike's onset, are not counted at all: acting on the first one would have rolled
those steps back. Nor are firings on steps a series shares with another
(`Series.shared_until`): they are scored once, there. Every other firing is a false
alarm. So an alarm is either a detection (one per detected spike) or a false alarm, and

    precision = detected / (detected + false alarms)      recall = detected / labelled

with precision undefined (None) when the detector never fired.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Spike:
    """A labelled spike: where it starts, and what caused it (for the tables)."""

    onset: int
    label: str = ""
    size: float = float("nan")
    """The largest loss in its window over the fault-free run's at the same step."""


@dataclass(frozen=True, slots=True)
class Series:
    """One run's loss per step (steps the trainer skipped are absent) and its spikes."""

    name: str
    losses: dict[int, float]
    spikes: tuple[Spike, ...] = ()
    shared_until: int = 0
    """Steps before this repeat another series step for step (a faulted run's steps before
    its first fault are the clean run's of its seed): firings there are scored there."""

    @property
    def clean(self) -> bool:
        """No fault was injected into this run."""
        return not self.spikes


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a detector's firings on one series came to."""

    detected: dict[int, int] = field(default_factory=dict)
    """Onset of each detected spike -> its delay in steps."""
    false_alarms: list[int] = field(default_factory=list)
    """Steps of the firings that match no labelled spike."""
    ignored: list[int] = field(default_factory=list)
    """Steps of the firings after a detection that a rollback would have replaced."""


def match(
    firings: Iterable[int],
    spikes: Sequence[Spike],
    *,
    window: int,
    aftermath: int,
    shared_until: int = 0,
) -> Outcome:
    """Match firing steps to labelled spikes (see the module's docstring); firings before
    ``shared_until`` are ignored."""
    if window < 0 or aftermath < window:
        raise ValueError(f"need 0 <= window <= aftermath, got {window} and {aftermath}")
    outcome = Outcome()
    for step in sorted(set(firings)):
        if step < shared_until:
            outcome.ignored.append(step)
            continue
        hit = next((s for s in spikes if s.onset <= step <= s.onset + window), None)
        if hit is not None and hit.onset not in outcome.detected:
            outcome.detected[hit.onset] = step - hit.onset
            continue
        after = any(
            s.onset in outcome.detected and s.onset <= step <= s.onset + aftermath for s in spikes
        )
        (outcome.ignored if after else outcome.false_alarms).append(step)
    return outcome


@dataclass(frozen=True, slots=True)
class Score:
    """A detector's figures over a set of series."""

    spikes: tuple[tuple[Spike, int | None], ...]
    """Every labelled spike with its delay, None when it went undetected."""
    false_alarms: int
    clean_steps: int
    clean_false_alarms: int

    @property
    def labelled(self) -> int:
        """Labelled spikes."""
        return len(self.spikes)

    @property
    def delays(self) -> list[int]:
        """Delay of every detected spike."""
        return [delay for _, delay in self.spikes if delay is not None]

    @property
    def detected(self) -> int:
        """Labelled spikes detected."""
        return len(self.delays)

    @property
    def precision(self) -> float | None:
        """Detections over alarms; None when it never fired."""
        alarms = self.detected + self.false_alarms
        return self.detected / alarms if alarms else None

    @property
    def recall(self) -> float | None:
        """Detections over labelled spikes; None when there were none."""
        return self.detected / self.labelled if self.labelled else None

    @property
    def false_alarms_per_1000_clean_steps(self) -> float | None:
        """False alarms on the fault-free series, per 1,000 of their steps."""
        return 1000 * self.clean_false_alarms / self.clean_steps if self.clean_steps else None

    @property
    def median_delay(self) -> float | None:
        """Median steps from onset to the detecting firing; None when nothing was detected."""
        return statistics.median(self.delays) if self.delays else None


def score(
    firings: dict[str, Iterable[int]], series: Sequence[Series], *, window: int, aftermath: int
) -> Score:
    """Score firing steps (by series name) over the series."""
    spikes: list[tuple[Spike, int | None]] = []
    false_alarms = clean_steps = clean_false = 0
    for one in series:
        outcome = match(
            firings.get(one.name, ()),
            one.spikes,
            window=window,
            aftermath=aftermath,
            shared_until=one.shared_until,
        )
        spikes += [(spike, outcome.detected.get(spike.onset)) for spike in one.spikes]
        false_alarms += len(outcome.false_alarms)
        if one.clean:
            clean_steps += len(one.losses)
            clean_false += len(outcome.false_alarms)
    return Score(tuple(spikes), false_alarms, clean_steps, clean_false)
