"""Every stability mechanism of the reference trainer, in one ordered table.

An entry names the mechanism (`harness.mechanisms`), what switches it off in
`StabilityConfig`, and the `Mechanism` whose hooks act in the step, if any:
many act elsewhere (checkpoints, data stages, processes) and only read their config.

The order is the order the step calls the hooks at each point, and so the order of the
claims in the journal and of the keys in a checkpoint's ``trainer`` state. What it keeps:
the guard judges before the layer checks; surgery (in the layer checks) lowers the learning
rate before the adaptive warmup, shapes the gradients before clipping, and is judged
before the layer checks' claims; the loss scale changes before blocks switch precision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reference_trainer.stability.adaptive_batch_step import AdaptiveBatch
from reference_trainer.stability.adaptive_warmup_step import AdaptiveWarmupStep
from reference_trainer.stability.clipping_step import Clipping
from reference_trainer.stability.hard_sample_step import HardSampleWeighting
from reference_trainer.stability.layer_step import LayerChecks
from reference_trainer.stability.loss_scale_step import LossScaling
from reference_trainer.stability.mechanism import BuildContext, Mechanism
from reference_trainer.stability.mechanisms import StabilityConfig
from reference_trainer.stability.nonfinite_guard import NonfiniteGuard
from reference_trainer.stability.precision_switch_step import PrecisionSwitching
from reference_trainer.stability.quality_step import QualitySampling
from reference_trainer.stability.replica_step import ReplicaCheck
from reference_trainer.stability.rl_lr_step import RlLr
from reference_trainer.stability.straggler_step import StragglerWatch


@dataclass(frozen=True, slots=True)
class Entry:
    """One mechanism: its name, its switch and its hooks in the step."""

    name: str
    #: Dotted fields of `StabilityConfig` and the values that switch the mechanism off
    #: (an opt-in is switched on by `StabilityConfig.enable`).
    switch: dict[str, Any] = field(default_factory=dict)
    #: Its hooks in the step (None: it acts elsewhere, from its config).
    hooks: type[Mechanism] | None = None
    #: Off by default, switched on by ``--enable`` (`harness.mechanisms.OPT_IN`).
    opt_in: bool = False
    #: ``--fragile`` switches it off (checkpoints stay asynchronous under it).
    fragile: bool = True


def _off(name: str) -> dict[str, Any]:
    return {f"{name}.enabled": False}


#: Every mechanism, in the order the step calls them.
REGISTRY: tuple[Entry, ...] = (
    Entry("nonfinite_guard", {"nonfinite_guard": False}, NonfiniteGuard),
    Entry("loss_scale", _off("loss_scale"), LossScaling),
    Entry("precision_switch", _off("precision_switch"), PrecisionSwitching),
    Entry("layer_stats", _off("layer_stats"), LayerChecks),
    Entry("underflow", _off("underflow")),  # acts through LayerChecks
    Entry("surgery", _off("surgery")),  # acts through LayerChecks
    Entry("adaptive_warmup", _off("adaptive_warmup"), AdaptiveWarmupStep),
    Entry("clipping", _off("clipping"), Clipping),
    Entry("quality_sampling", hooks=QualitySampling, opt_in=True),
    Entry("hard_sample_weighting", hooks=HardSampleWeighting, opt_in=True),
    Entry("adaptive_batch", hooks=AdaptiveBatch, opt_in=True),
    Entry("spikes", {"spikes.enabled": (), "spikes.acting": ()}),
    Entry("integrity", {"checkpoints.integrity": False}),
    Entry("delta", {"checkpoints.delta": False}),
    Entry("async", {"checkpoints.asynchronous": False}, fragile=False),
    Entry("recovery", _off("recovery")),
    Entry("dedup", _off("dedup")),
    Entry("semantic_dedup", _off("semantic_dedup")),
    Entry("tokenizer_fallback", _off("tokenizer_fallback")),
    Entry("toxicity_filter", _off("toxicity")),
    Entry("watchdog", _off("watchdog")),
    Entry("preemption", {"preemption": False}),
    Entry("crash_report", {"crash_report": False}),
    Entry("oom_retry", _off("oom_retry")),  # acts in the passes (reference_trainer/passes.py)
    Entry("lr_floor", {"lr_floor": 0.0}),
    Entry("replica_check", _off("replica_check"), ReplicaCheck),
    Entry("stragglers", _off("stragglers"), StragglerWatch),
    Entry("straggler_rebalance", opt_in=True),  # acts through StragglerWatch
    # Last: it reads the step's skip and the other mechanisms' claims.
    Entry("rl_lr", hooks=RlLr, opt_in=True),
    # Acts on the spike detectors' claims (switched on only with its detector on).
    Entry("forecast_acting", opt_in=True),
)
BY_NAME = {entry.name: entry for entry in REGISTRY}


def _set(config: StabilityConfig, switch: dict[str, Any]) -> None:
    for path, value in switch.items():
        *parents, leaf = path.split(".")
        owner: Any = config
        for part in parents:
            owner = getattr(owner, part)
        setattr(owner, leaf, value)


def disable(config: StabilityConfig, name: str) -> None:
    """Switch off one mechanism by its name (`harness.mechanisms.TRAINER_MECHANISMS`)."""
    entry = BY_NAME[name]
    if entry.opt_in:
        raise KeyError(name)
    _set(config, entry.switch)


def fragile() -> StabilityConfig:
    """Every stability mechanism off (checkpoints stay full, written in the background)."""
    config = StabilityConfig()
    for entry in REGISTRY:
        if not entry.opt_in and entry.fragile:
            _set(config, entry.switch)
    return config


def build_mechanisms(ctx: BuildContext) -> list[Mechanism]:
    """The mechanisms with hooks in the step that are on in this run, in the step's order."""
    built = [entry.hooks.build(ctx) for entry in REGISTRY if entry.hooks is not None]
    return [mechanism for mechanism in built if mechanism is not None]


def in_order(mechanisms: list[Mechanism]) -> list[tuple[type[Mechanism], Mechanism | None]]:
    """Every mechanism with hooks in the step, in the step's order, with its instance when
    it is on in this run (None when off)."""
    on = {type(m): m for m in mechanisms}
    return [(e.hooks, on.get(e.hooks)) for e in REGISTRY if e.hooks is not None]


def mechanism_states(mechanisms: list[Mechanism]) -> dict[str, Any]:
    """The mechanisms' part of a checkpoint's ``trainer`` state: every key of every
    mechanism with hooks, ``{}`` for one that is off."""
    state: dict[str, Any] = {}
    for hooks, mechanism in in_order(mechanisms):
        if mechanism is not None:
            state.update(mechanism.state_dict())
        else:
            state.update({key: {} for key in hooks.state_keys})
    return state
