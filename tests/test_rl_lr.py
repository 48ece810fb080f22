"""The learning-rate controller's rules (opt-in `rl_lr`): what a window measures, how the
table learns and chooses, the cap, its state across a resume and a rollback."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from harness.records.events import Detected, LrDecided
from harness.sweeps.sweep_file import load_sweep
from reference_trainer.errors import ConfigError
from reference_trainer.model.optim import lr_at
from reference_trainer.stability.mechanism import BuildContext, StepState
from reference_trainer.stability.mechanisms import StabilityConfig
from reference_trainer.stability.rl_lr import LrPolicy, RlLrConfig, describe, measure
from reference_trainer.stability.rl_lr_step import RlLr

FALLING = [6.0 - 0.05 * i for i in range(10)]  # steady progress, no spike
NORMS = [1.0 + 0.01 * (i % 2) for i in range(10)]  # quiet gradients


def feed(policy: LrPolicy, losses: list[float], norms: list[float] = NORMS) -> dict[str, Any]:
    """One whole window; the decision it ends with."""
    decisions = [policy.observe(x, n, flagged=False) for x, n in zip(losses, norms, strict=True)]
    assert decisions[:-1] == [None] * (len(losses) - 1)
    assert decisions[-1] is not None
    return decisions[-1]


def test_a_window_measures_progress_spikes_against_the_reference_and_noise() -> None:
    quiet = measure(FALLING, NORMS, [False] * 10, ratio=1.2, reference=math.nan)
    first, second = sum(FALLING[:5]) / 5, sum(FALLING[5:]) / 5
    assert quiet.progress == pytest.approx((first - second) / first)
    assert quiet.unstable == 0 and quiet.noise < 0.01
    # A level shift: every step after it is at least 1.2x the previous window's median.
    shifted = [5.6, 5.5, 20.0, 19.5, 19.8, 19.0, 18.7, 19.2, 18.9, 18.5]
    window = measure(shifted, NORMS, [False] * 10, ratio=1.2, reference=5.7)
    assert window.unstable == 8 and window.progress < 0
    # Against its own median the shift would hide: the reference is why it is seen.
    assert measure(shifted, NORMS, [False] * 10, ratio=1.2, reference=math.nan).unstable == 0
    # Skipped steps and non-finite losses are unstable; a non-finite loss is no progress.
    flagged = [i == 3 for i in range(10)]
    broken = measure([*FALLING[:9], math.nan], NORMS, flagged, ratio=1.2, reference=6.0)
    assert broken.unstable == 2 and broken.progress == 0.0
    # A gradient burst is noise: log-ratios of about +-6.9.
    burst = [1.0, 1.0, 1000.0, 1000.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert measure(FALLING, burst, [False] * 10, ratio=1.2, reference=6.0).noise > 1


def test_states_are_named_in_words() -> None:
    assert describe(4) == {"trend": "flat", "noisy": False, "unstable": False}
    assert describe(11) == {"trend": "rising", "noisy": True, "unstable": True}
    assert describe(0) == {"trend": "falling", "noisy": False, "unstable": False}


def test_steady_progress_keeps_the_schedule_and_instability_lowers_it() -> None:
    policy = LrPolicy(RlLrConfig(enabled=True, epsilon=0.0), seed=0)
    assert policy.multiplier == 1.0  # the first window trains at the schedule
    decision = feed(policy, FALLING)
    assert decision["multiplier"] == 1.0 and decision["state"]["trend"] == "falling"
    assert decision["reward"] == pytest.approx(decision["progress"]) and decision["reward"] > 0
    spiked = [5.5, 5.4, 20.0, 19.5, 19.8, 19.0, 18.7, 19.2, 18.9, 18.5]
    decision = feed(policy, spiked)
    assert decision["state"] == {"trend": "rising", "noisy": False, "unstable": True}
    assert decision["reward"] < -0.5  # 8 unstable steps cost 0.8 of the penalty
    assert decision["multiplier"] == 0.5 and policy.multiplier == 0.5  # caution first
    # The table keeps what it learned, each reward under the state 1.0 was chosen in: the
    # start (flat, quiet, stable) earned progress, the falling state the spike's penalty.
    assert policy.q[4][2] > 0 and policy.q[0][2] < 0
    assert policy.counts[4][2] == policy.counts[0][2] == 1


def test_a_multiplier_that_did_badly_in_a_state_is_left_and_one_that_did_well_kept() -> None:
    policy = LrPolicy(RlLrConfig(enabled=True, epsilon=0.0), seed=0)
    rising = [5.0 + 0.2 * i for i in range(10)]  # worse every step, no spike over 1.2x
    feed(policy, FALLING)
    first = feed(policy, rising)  # a new state, quiet and stable: the schedule first
    assert first["state"]["trend"] == "rising" and first["multiplier"] == 1.0
    second = feed(policy, rising)  # 1.0 did badly there: another multiplier is tried
    assert second["state"]["trend"] == "rising" and second["multiplier"] != 1.0
    assert policy.q[8][2] < 0
    tried = second["multiplier"]
    feed(policy, FALLING)  # the one tried did well in the rising state
    third = feed(policy, rising)
    assert third["state"]["trend"] == "rising" and third["multiplier"] == tried


def test_exploration_follows_the_seeded_generator() -> None:
    def choices(seed: int) -> list[float]:
        policy = LrPolicy(RlLrConfig(enabled=True, epsilon=1.0), seed=seed)
        return [feed(policy, FALLING)["multiplier"] for _ in range(12)]

    assert choices(3) == choices(3)
    assert choices(3) != choices(4)
    assert set(choices(3)) <= {0.5, 0.7, 1.0, 1.2} and len(set(choices(3))) > 1


def test_a_restored_policy_decides_as_the_uninterrupted_one() -> None:
    cfg = RlLrConfig(enabled=True, epsilon=0.5)
    straight, saved = LrPolicy(cfg, seed=7), LrPolicy(cfg, seed=7)
    for policy in (straight, saved):
        feed(policy, FALLING)
        for x in FALLING[:4]:  # half a window in flight
            policy.observe(x, 1.0, flagged=False)
    state = saved.state_dict()
    restored = LrPolicy(cfg, seed=123)  # another seed: the generator comes from the state
    restored.load_state_dict(state)
    tail = FALLING[4:] + FALLING
    a = [straight.observe(x, 1.0, flagged=False) for x in tail * 3]
    b = [restored.observe(x, 1.0, flagged=False) for x in tail * 3]
    assert a == b and sum(d is not None for d in a) == 5


def test_a_checkpoint_of_other_multipliers_is_refused_by_name() -> None:
    state = LrPolicy(RlLrConfig(enabled=True), seed=0).state_dict()
    other = LrPolicy(RlLrConfig(enabled=True, multipliers=(0.5, 1.0)), seed=0)
    with pytest.raises(ConfigError, match=r"stability\.rl_lr: the checkpoint's table"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"multipliers": ()}, "multipliers"),
        ({"multipliers": (1.0, 1.0)}, "multipliers"),
        ({"multipliers": (0.0, 1.0)}, "multipliers"),
        ({"every": 2}, "every"),
        ({"epsilon": 1.5}, "epsilon"),
        ({"alpha": 0.0}, "alpha"),
        ({"penalty": -1.0}, "penalty"),
        ({"max_lr_ratio": math.inf}, "max_lr_ratio"),
        ({"spike_ratio": 1.0}, "spike_ratio"),
    ],
)
def test_bad_config_names_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=rf"stability\.rl_lr\.{named}"):
        RlLrConfig(**fields)


def test_off_by_default_and_enable_switches_it_on() -> None:
    config = StabilityConfig()
    assert not config.rl_lr.enabled
    config.enable("rl_lr")
    assert config.rl_lr.enabled


def controller(steps: int = 100, warmup: int = 10, **fields: Any) -> RlLr:
    stability = StabilityConfig()
    stability.rl_lr = RlLrConfig(enabled=True, **fields)
    ctx = SimpleNamespace(stability=stability, seed=0, warmup_steps=warmup, steps=steps)
    built = RlLr.build(cast(BuildContext, ctx))
    assert built is not None
    return built


def test_the_learning_rate_never_exceeds_the_cap() -> None:
    mech = controller(multipliers=(0.5, 1.5), max_lr_ratio=1.0, epsilon=0.0)
    mech.policy.action = 1  # 1.5 in force
    for step in range(1, 101):
        shape = lr_at(step - 1, max_lr=1.0, warmup_steps=10, total_steps=100, min_lr_ratio=0.1)
        assert shape * mech.lr_factor(step) <= 1.0 + 1e-12
    assert mech.lr_factor(2) == 1.5  # early warmup: far under the peak, not capped
    assert mech.lr_factor(10) == pytest.approx(1.0)  # at the peak the cap holds it to 1
    mech.policy.action = 0
    assert mech.lr_factor(10) == 0.5  # a lower multiplier is never raised


def step_state(step: int, loss: float, claims: list[Any] | None = None) -> StepState:
    s = StepState(step, 1e-3, claims=list(claims or []))
    s.loss, s.mean_norm = loss, 1.0
    return s


def test_each_decision_is_journaled_and_other_mechanisms_claims_count_as_unstable() -> None:
    mech = controller(epsilon=0.0)
    events = []
    for step, loss in enumerate(FALLING, start=1):
        s = step_state(step, loss, [Detected(detector="layer_swing")] if step == 4 else [])
        mech.begin_step(s)
        mech.finish(s)
        events += [c for c in s.claims if isinstance(c, LrDecided)]
    (event,) = events
    assert event.from_step == 11 and event.details["unstable_steps"] == 1
    assert event.state["unstable"] and event.multiplier == 0.5 and event.applied == 0.5


def test_a_rollback_is_learned_from_and_a_resume_takes_the_saved_policy() -> None:
    mech = controller(epsilon=0.0)
    for step, loss in enumerate(FALLING, start=1):
        s = step_state(step, loss)
        mech.begin_step(s)
        mech.finish(s)
    saved = mech.state_dict()
    assert isinstance(saved["rl_lr"]["generator"], torch.Tensor)
    # A rollback: the trainer restores a checkpoint while the controller is live.
    mech.load_state_dict({"rl_lr": {}})
    s = step_state(11, 5.0)
    mech.begin_step(s)
    (event,) = s.claims
    assert isinstance(event, LrDecided) and event.details["rollback"] is True
    assert event.reward == -1.0 and event.multiplier == 0.5 and event.state["unstable"]
    # A resume in a fresh process takes the saved table, window and multiplier.
    fresh = controller(epsilon=0.0)
    fresh.load_state_dict(saved)
    assert fresh.policy.state_dict()["q"] == saved["rl_lr"]["q"]
    assert fresh.policy.multiplier == 1.0 and fresh.pending is None


def test_the_sweep_file_compares_the_controller_with_the_fixed_schedule() -> None:
    path = Path(__file__).resolve().parent.parent / "scenarios" / "sweeps" / "rl_lr.yaml"
    sweep = load_sweep(path)
    assert [cell.label for cell in sweep.cells()] == ["enable=[]", "enable=['rl_lr']"]
    kinds = {fault.kind for fault in sweep.scenario.faults}
    assert kinds == {"lr_spike", "grad_spike"}
