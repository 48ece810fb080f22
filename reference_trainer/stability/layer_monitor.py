"""The per-layer watch of one process: statistics every step, judged against each layer's
history (swing, stall), and the diagnosis of the problem layer when a detector fires.

The trainer calls it at fixed points of a step (`begin`, `gradients` after unscaling,
`before_update`/`after_update` around the optimizer step, `finish`), then `settle` with
whether the step went well: only good steps enter the history the next ones are judged by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from reference_trainer.stability.layer_diagnosis import Diagnosis, diagnose
from reference_trainer.stability.layer_stats import LayerStats, LayerStatsConfig, StepStats
from reference_trainer.stability.layer_watch import LayerHistory, StallConfig, StallWatch, Swing
from reference_trainer.stability.layer_watch import swings as find_swings


@dataclass(frozen=True, slots=True)
class GradientVerdict:
    """What the layers' gradients say, before the ranks agree on the step."""

    swings: list[Swing] = field(default_factory=list)
    stalls: list[dict[str, Any]] = field(default_factory=list)
    #: A layer is stalled now: fp16 runs raise the loss scale.
    stalled: bool = False
    #: Layers whose gradient norm is not finite while other layers' are.
    broken: list[str] = field(default_factory=list)

    @property
    def ups(self) -> list[str]:
        """Layers whose (finite) gradient swung up."""
        return [s.layer for s in self.swings if s.signal == "grad_norm" and s.direction == "up"]

    @property
    def skip(self) -> bool:
        """A layer's gradient swung up: this rank asks for the update to be skipped."""
        return bool(self.ups)

    @property
    def repairable(self) -> list[str]:
        """Layers gradient surgery could repair: swung up, or not finite while the rest is."""
        return [*self.ups, *self.broken]


class LayerMonitor:
    """Per-layer statistics, history, swing and stall detection, diagnosis."""

    def __init__(
        self,
        config: LayerStatsConfig,
        stall: StallConfig,
        model: nn.Module,
        blocks: list[nn.Module],
        final: nn.Module,
    ) -> None:
        self.config, self.stall_config = config, stall
        self.stats = LayerStats(model, blocks, final)
        self.history = LayerHistory(config.history)
        self.stall = StallWatch(stall, config.min_history)
        self.previous: StepStats | None = None

    @property
    def order(self) -> list[str]:
        """Layers in forward order."""
        return self.stats.order

    def begin(self, step: int) -> None:
        """A new step."""
        self.stats.begin(step)

    def gradients(self) -> GradientVerdict:
        """Record the gradients (after unscaling) and judge them against the history."""
        norms = self.stats.gradients()
        found: list[Swing] = []
        if self.config.enabled:
            cfg, current = self.config, self.stats.current
            found = find_swings(norms, "grad_norm", self.history, cfg.swing_factor,
                                cfg.min_history)  # fmt: skip
            weights = {n: v["weight_norm"] for n, v in current.layers.items() if "weight_norm" in v}
            found += find_swings(weights, "weight_norm", self.history, cfg.swing_factor,
                                 cfg.min_history, non_finite=True)  # fmt: skip
        stalls: list[dict[str, Any]] = []
        if self.stall_config.enabled:
            stalls = self.stall.observe(self.stats.current, self.previous, self.history)
        broken = [name for name, norm in norms.items() if not math.isfinite(norm)]
        if len(broken) == len(norms) or not self.config.enabled:
            broken = []  # every layer: the cause is upstream of them all (the loss)
        return GradientVerdict(found, stalls, bool(self.stall.stalled()), broken)

    def before_update(self) -> None:
        """Just before the optimizer step."""
        self.stats.before_update()

    def after_update(self, skipped: bool) -> None:
        """Just after the optimizer step (or its skip)."""
        self.stats.after_update(skipped)

    def finish(self) -> tuple[StepStats, list[Swing]]:
        """The step's complete statistics, and the layers whose largest activation swung
        up (or is not finite)."""
        stats = self.stats.finish()
        if not self.config.enabled:
            return stats, []
        peaks = {n: v["act_max"] for n, v in stats.layers.items() if "act_max" in v}
        cfg = self.config
        found = find_swings(peaks, "act_max", self.history, cfg.swing_factor, cfg.min_history,
                            directions=("up",), non_finite=True)  # fmt: skip
        return stats, found[:1]  # the first in forward order: the others inherit it

    def settle(self, stats: StepStats, good: bool) -> None:
        """A good step's figures become history; every step's become the previous ones."""
        if good:
            self.history.add(stats)
        self.previous = stats

    def diagnose(self, stats: StepStats, detectors: list[str]) -> Diagnosis:
        """The layer(s) behind this step's detections."""
        return diagnose(
            stats,
            self.history,
            detectors,
            order=self.order,
            factor=self.config.diagnose_factor,
        )

    def due(self, step: int) -> bool:
        """A `layer_stats` event is journaled at this step even without an anomaly."""
        return self.config.enabled and step % self.config.journal_every == 0

    def state_dict(self) -> dict[str, Any]:
        """History and stall streaks, for checkpoints."""
        return {"history": self.history.state_dict(), "streak": dict(self.stall.streak)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""
        self.history.load_state_dict(state["history"])
        self.stall.streak = {str(k): int(v) for k, v in state["streak"].items()}
        self.previous = None

    def remove(self) -> None:
        """Take the hooks off the model."""
        self.stats.remove()
