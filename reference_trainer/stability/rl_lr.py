"""The learning-rate controller (opt-in `rl_lr`): a contextual bandit that learns, from the
run's own signals, which multiplier of the schedule to train at.

Every ``every`` steps a decision window closes. Its signals, from figures every rank agrees
on (the mean loss, the mean gradient norm, whether the update was skipped):

- **progress**: ``(mean of the window's first half - mean of its second half) / first``, over
  its finite losses (0 when one is not finite);
- **unstable steps**: skipped, non-finite, a loss ``spike_ratio`` x the reference or above
  (the previous window's median loss; the first window's own), or a step another mechanism
  repaired or flagged (`INSTABILITY`);
- **gradient noise**: half the variance of the log-ratios of successive gradient norms (the
  adaptive warmup's measure), above ``noise_threshold`` or not.

The reward of the multiplier that was in force is ``progress - penalty * unstable / every``;
a rollback (the trainer restored a checkpoint while the controller was live) is a reward of
``-penalty``. The table holds, per state (trend falling / flat / rising x noisy x unstable:
12 states) and multiplier, a moving average of the rewards seen (step size ``alpha``). The
next multiplier is the best of the state's row, or with probability ``epsilon`` one drawn
at random by a generator seeded from the run's seed. Ties (a row not yet learned) go to the
multiplier nearest 1 in a quiet, stable state and to the lowest in a noisy or unstable one:
caution first, until the table has learned otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from reference_trainer.errors import ConfigError
from reference_trainer.stability.adaptive_warmup import log_ratio_variance

NAME = "rl_lr"
PREFIX = f"stability.{NAME}"

TRENDS = ("falling", "flat", "rising")
#: Claims of other mechanisms that make a step unstable (detector or recovery action names).
INSTABILITY = frozenset({"nonfinite_guard", "fp16_overflow", "layer_swing", "gradient_surgery"})


@dataclass(kw_only=True, slots=True)
class RlLrConfig:
    """The learning-rate controller (opt-in, off by default)."""

    enabled: bool = False
    """Off, the schedule is applied as it is."""
    multipliers: tuple[float, ...] = (0.5, 0.7, 1.0, 1.2)
    """The multipliers of the scheduled learning rate it chooses from (the actions)."""
    every: int = 10
    """Steps per decision window (the first window trains at the multiplier nearest 1)."""
    epsilon: float = 0.1
    """Chance of a random multiplier instead of the best one at each decision."""
    alpha: float = 0.3
    """Step size of the table's moving average of rewards."""
    penalty: float = 1.0
    """Reward lost for a window of unstable steps (a share of it per unstable step); a
    rollback costs all of it. Measured: a clean tiny run's progress over a window of 10
    steps swings by up to +-0.15 from batch to batch, so one unstable step (0.1) counts
    about as much as that noise, a rollback far more."""
    spike_ratio: float = 1.2
    """A step whose loss is this many times the previous window's median is unstable."""
    trend_band: float = 0.005
    """Relative progress within this band of 0 is a flat trend."""
    noise_threshold: float = 0.25
    """Gradient noise (half the variance of log-ratios of successive norms) above this is
    noisy (a clean tiny run measured 0.003 to 0.2 per window of 10 steps)."""
    max_lr_ratio: float = 1.0
    """Cap: the scheduled learning rate times the multiplier never exceeds this fraction of
    the schedule's peak."""
    seed: int = 0
    """Added to the run's seed for the exploration generator."""

    def __post_init__(self) -> None:
        ms = self.multipliers = tuple(float(m) for m in self.multipliers)
        if not ms or len(set(ms)) != len(ms) or not all(math.isfinite(m) and m > 0 for m in ms):
            raise ConfigError(f"{PREFIX}.multipliers must be distinct numbers > 0, got {ms}")
        if not (isinstance(self.every, int) and self.every >= 4):
            raise ConfigError(f"{PREFIX}.every must be an integer >= 4, got {self.every!r}")
        for name in ("epsilon", "alpha"):
            value = getattr(self, name)
            if not 0 <= value <= 1 or (name == "alpha" and value == 0):
                raise ConfigError(f"{PREFIX}.{name} must be in (0, 1], got {value}")
        for name in ("penalty", "trend_band", "noise_threshold", "max_lr_ratio"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{PREFIX}.{name} must be > 0, got {value}")
        if not (math.isfinite(self.spike_ratio) and self.spike_ratio > 1):
            raise ConfigError(f"{PREFIX}.spike_ratio must be > 1, got {self.spike_ratio}")


@dataclass(frozen=True, slots=True)
class Window:
    """What a closed window measured."""

    progress: float
    unstable: int
    noise: float
    #: The window's median finite loss (nan: none), the next window's reference.
    median: float

    def state(self, cfg: RlLrConfig) -> int:
        """The state index: trend x noisy x unstable."""
        trend = 1
        if self.progress > cfg.trend_band:
            trend = 0
        elif self.progress < -cfg.trend_band:
            trend = 2
        return trend * 4 + (self.noise > cfg.noise_threshold) * 2 + (self.unstable > 0)

    def reward(self, cfg: RlLrConfig) -> float:
        """Progress less the instability penalty."""
        return self.progress - cfg.penalty * self.unstable / cfg.every


def describe(state: int) -> dict[str, Any]:
    """A state index in words, as journaled."""
    return {"trend": TRENDS[state // 4], "noisy": bool(state & 2), "unstable": bool(state & 1)}


def measure(
    losses: list[float], norms: list[float], flagged: list[bool], *, ratio: float, reference: float
) -> Window:
    """The signals of one window's steps (``flagged``: skipped or claimed unstable), its
    spikes judged against ``reference`` (nan: against the window's own median)."""
    finite = [x for x in losses if math.isfinite(x)]
    progress = 0.0
    if len(finite) == len(losses) >= 2:
        half = len(losses) // 2
        first, second = statistics.fmean(losses[:half]), statistics.fmean(losses[half:])
        progress = (first - second) / first if first > 0 else 0.0
    median = statistics.median(finite) if finite else math.nan
    base = reference if math.isfinite(reference) else median
    unstable = sum(
        1
        for loss, bad in zip(losses, flagged, strict=True)
        if bad or not math.isfinite(loss) or (base > 0 and loss >= ratio * base)
    )
    good = [n for n in norms if math.isfinite(n) and n > 0]
    noise = log_ratio_variance(good) if len(good) >= 3 else 0.0
    return Window(progress, unstable, noise, median)


@dataclass(slots=True)
class LrPolicy:
    """The table, the window being measured and the multiplier in force."""

    cfg: RlLrConfig
    seed: int
    q: list[list[float]] = field(init=False)
    counts: list[list[int]] = field(init=False)
    #: The multiplier in force (an index of ``cfg.multipliers``) and the state it was chosen in.
    action: int = field(init=False)
    state: int = 4  # flat, quiet, stable
    decisions: int = 0
    #: The last window's median loss, which the next window's spikes are judged against.
    reference: float = math.nan
    losses: list[float] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)
    flagged: list[bool] = field(default_factory=list)
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.cfg.multipliers)
        self.q = [[0.0] * n for _ in range(12)]
        self.counts = [[0] * n for _ in range(12)]
        self.action = self._tie_break(range(n), self.state)
        self.generator = torch.Generator().manual_seed(self.seed + self.cfg.seed)

    @property
    def multiplier(self) -> float:
        """The multiplier in force."""
        return self.cfg.multipliers[self.action]

    def _tie_break(self, indices: Iterable[int], state: int) -> int:
        """Among equally valued multipliers: nearest 1 when the state is quiet and stable,
        else the lowest."""
        ms = self.cfg.multipliers
        if state & 3:
            return int(min(indices, key=lambda i: (ms[i], i)))
        return int(min(indices, key=lambda i: (abs(math.log(ms[i])), i)))

    def observe(self, loss: float, norm: float, *, flagged: bool) -> dict[str, Any] | None:
        """One step's agreed figures; at a window's end, the decision made (else None)."""
        self.losses.append(loss)
        self.norms.append(norm if not flagged else math.nan)
        self.flagged.append(flagged)
        if len(self.losses) < self.cfg.every:
            return None
        window = measure(
            self.losses,
            self.norms,
            self.flagged,
            ratio=self.cfg.spike_ratio,
            reference=self.reference,
        )
        if math.isfinite(window.median):
            self.reference = window.median
        return self._decide(window.reward(self.cfg), window.state(self.cfg), window)

    def rolled_back(self) -> dict[str, Any]:
        """The trainer restored a checkpoint: the multiplier in force is penalized in full,
        and a new one chosen for an unstable state of the same trend."""
        return self._decide(-self.cfg.penalty, self.state | 1, None)

    def _decide(self, reward: float, state: int, window: Window | None) -> dict[str, Any]:
        row = self.q[self.state]
        row[self.action] += self.cfg.alpha * (reward - row[self.action])
        self.counts[self.state][self.action] += 1
        before = self.multiplier
        n = len(self.cfg.multipliers)
        explored = float(torch.rand((), generator=self.generator)) < self.cfg.epsilon
        if explored:
            self.action = int(torch.randint(n, (), generator=self.generator))
        else:
            best = max(self.q[state])
            self.action = self._tie_break((i for i in range(n) if self.q[state][i] == best), state)
        self.state, self.decisions = state, self.decisions + 1
        self.losses, self.norms, self.flagged = [], [], []
        decision: dict[str, Any] = {
            "multiplier": self.multiplier,
            "previous": before,
            "state": describe(state),
            "reward": reward,
            "explored": explored,
            "values": dict(zip(map(str, self.cfg.multipliers), self.q[state], strict=True)),
            "decision": self.decisions,
        }
        if window is not None:
            decision |= {"progress": window.progress, "unstable_steps": window.unstable}
            decision["grad_noise"] = window.noise
        else:
            decision["rollback"] = True
        return decision

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs to decide as the uninterrupted run does."""
        return {
            "q": [list(row) for row in self.q],
            "counts": [list(row) for row in self.counts],
            "action": self.action,
            "state": self.state,
            "decisions": self.decisions,
            "reference": self.reference,
            "losses": list(self.losses),
            "norms": list(self.norms),
            "flagged": list(self.flagged),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output (refused when the multipliers changed)."""
        n = len(self.cfg.multipliers)
        if len(state["q"]) != 12 or any(len(row) != n for row in state["q"]):
            raise ConfigError(
                f"{PREFIX}: the checkpoint's table does not fit {n} multipliers "
                f"{self.cfg.multipliers}: resume with the multipliers it was saved with"
            )
        self.q = [[float(v) for v in row] for row in state["q"]]
        self.counts = [[int(v) for v in row] for row in state["counts"]]
        self.action, self.state = int(state["action"]), int(state["state"])
        self.decisions = int(state["decisions"])
        self.reference = float(state["reference"])
        self.losses = [float(v) for v in state["losses"]]
        self.norms = [float(v) for v in state["norms"]]
        self.flagged = [bool(v) for v in state["flagged"]]
        self.generator.set_state(state["generator"])
