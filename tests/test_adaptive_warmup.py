"""Adaptive warmup: the variance it measures, the factor it applies, and runs that show a
noisy start warming up at a lower learning rate and a too-high warmup learning rate
tamed (with and without the mechanism)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from harness.records.journal import Journal
from reference_trainer.errors import ConfigError
from reference_trainer.stability.adaptive_warmup import (
    AdaptiveWarmup,
    AdaptiveWarmupConfig,
    log_ratio_variance,
    warmup_factor,
)
from reference_trainer.stability.mechanisms import StabilityConfig
from reference_trainer.stability.registry import disable, fragile

from .stability_support import claims, config, final_loss, run

WARMUP = 20  # longer than the window, so the window fills during warmup

#: Every other warmup step trains on random tokens: the gradient norm swings step to step.
NOISY_START = [{"kind": "bad_batch", "at_step": s, "fraction": 1.0} for s in range(1, WARMUP, 2)]

#: The learning rate of warmup steps 3-12 is fifty times too high.
HOT_START = [{"kind": "lr_spike", "at_step": 3, "factor": 50.0, "duration": 10}]


def tracker(warmup_steps: int = 10, **fields: Any) -> AdaptiveWarmup:
    """A tracker with the given config fields."""
    return AdaptiveWarmup(AdaptiveWarmupConfig(**fields), warmup_steps)


def raw_cv2(norms: list[float]) -> float:
    """Squared coefficient of variation of the norms themselves (what is not measured)."""
    mean = sum(norms) / len(norms)
    return sum((n - mean) ** 2 for n in norms) / len(norms) / mean**2


# -- the measure ----------------------------------------------------------------------------


def test_a_steady_trend_is_no_variance_but_swings_are() -> None:
    falling = [2.4 * 0.85**i for i in range(9)]  # the fast fall of the first warmup steps
    swinging = [1.5 if i % 2 else 0.5 for i in range(9)]
    assert raw_cv2(falling) > 0.05  # the raw norms would read a clean start as noisy
    assert log_ratio_variance(falling) == pytest.approx(0.0, abs=1e-12)
    assert log_ratio_variance(swinging) > 0.3


def test_the_variance_is_half_that_of_the_log_ratios() -> None:
    norms = [1.0, 1.2, 0.9, 1.1, 1.3]
    ratios = [math.log(b / a) for a, b in itertools.pairwise(norms)]
    mean = sum(ratios) / len(ratios)
    expected = sum((r - mean) ** 2 for r in ratios) / len(ratios) / 2
    assert log_ratio_variance(norms) == pytest.approx(expected)


def test_the_factor_follows_the_formula_only_during_warmup() -> None:
    warmup = tracker(warmup_steps=10, window=4)
    norms = [1.0, 1.5, 0.7, 1.4, 0.6, 1.2]
    for norm in norms:
        warmup.observe(norm)
    variance = log_ratio_variance(norms[-5:])  # the window keeps its last 4 ratios
    assert warmup.grad_variance() == pytest.approx(variance)
    assert warmup.factor(10) == pytest.approx(1 / (1 + 10 * variance))
    assert warmup.factor(10) == warmup_factor(variance, 10.0) < 0.5
    assert warmup.factor(11) == 1.0  # after warmup the schedule is untouched


def test_too_few_norms_leave_the_factor_at_one() -> None:
    warmup = tracker(min_ratios=3)
    for norm in (1.0, 3.0, 0.3):  # two ratios: wild, but too few to judge
        warmup.observe(norm)
    assert warmup.grad_variance() is None and warmup.factor(1) == 1.0
    warmup.observe(3.0)
    assert warmup.factor(1) < 0.5


def test_skipped_and_non_finite_norms_are_left_out() -> None:
    warmup = tracker()
    for norm in (1.0, math.nan, 1.1, math.inf, 0.0, 1.0, 1.1):
        warmup.observe(norm)
    assert list(warmup.norms) == [1.0, 1.1, 1.0, 1.1]


def test_off_it_measures_nothing() -> None:
    config = StabilityConfig()
    disable(config, "adaptive_warmup")
    warmup = AdaptiveWarmup(config.adaptive_warmup, 10)
    for norm in (1.0, 3.0, 0.3, 3.0, 0.3):
        warmup.observe(norm)
    assert warmup.grad_variance() is None and warmup.factor(5) == 1.0
    assert not fragile().adaptive_warmup.enabled


def test_a_fall_is_claimed_once_until_the_factor_recovers() -> None:
    warmup = tracker(warmup_steps=100, window=3)
    found = []
    for step, norm in enumerate([1.0, 1.0, 1.0, 1.0, 3.0, 0.3, 3.0, 0.3, 1, 1, 1, 1, 3.0, 0.3], 1):
        warmup.observe(norm)
        claim = warmup.claim(step + 1, lr=1e-3)
        if claim is not None:
            found.append((step + 1, claim))
    assert [step for step, _ in found] == [6, 14]
    details = found[0][1].details
    assert details["factor"] < 0.5 and details["grad_variance"] > 0.1
    assert details["factor"] == pytest.approx(1 / (1 + 10 * details["grad_variance"]))


def test_the_state_round_trips() -> None:
    warmup = tracker()
    for norm in (1.0, 1.4, 0.8, 1.2, 0.9):
        warmup.observe(norm)
    warmup.claimed = True
    restored = tracker()
    restored.load_state_dict(warmup.state_dict())
    assert restored.factor(5) == warmup.factor(5) and restored.claimed


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"window": 1}, "stability.adaptive_warmup.window"),
        ({"window": 4, "min_ratios": 5}, "stability.adaptive_warmup.min_ratios"),
        ({"sensitivity": 0.0}, "stability.adaptive_warmup.sensitivity"),
        ({"sensitivity": math.nan}, "stability.adaptive_warmup.sensitivity"),
        ({"claim_below": 1.0}, "stability.adaptive_warmup.claim_below"),
    ],
)
def test_bad_config_names_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        AdaptiveWarmupConfig(**fields)


# -- runs -----------------------------------------------------------------------------------


def warmup_run(
    run_dir: Path,
    steps: int,
    faults: list[dict[str, Any]] | None = None,
    *,
    disable: tuple[str, ...] = (),
    seed: int = 0,
    **train: Any,
) -> Journal:
    """A tiny run whose warmup lasts `WARMUP` steps (``train``: `train()`'s options)."""
    cfg = config(steps=steps, disable=disable, seed=seed)
    cfg.optim.warmup_steps = WARMUP
    return run(run_dir, cfg, faults, **train)[1]


def lrs(journal: Journal) -> dict[int, float]:
    """The learning rate of each step."""
    return {step: event["lr"] for step, event in journal.steps().items()}


@pytest.fixture(scope="module")
def noisy_start(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    """The warmup run with `NOISY_START`, uninterrupted (both tests below read it)."""
    return warmup_run(tmp_path_factory.mktemp("noisy") / "run", WARMUP, NOISY_START)


@pytest.mark.slow
def test_a_noisier_start_warms_up_at_a_lower_lr(tmp_path: Path, noisy_start: Journal) -> None:
    clean = warmup_run(tmp_path / "clean", WARMUP)
    noisy = noisy_start
    plain = warmup_run(tmp_path / "plain", WARMUP, NOISY_START, disable=("adaptive_warmup",))
    measured = [s for s, e in noisy.steps().items() if "grad_variance" in e.fields]
    assert measured and measured[-1] == WARMUP
    for step in measured:
        assert lrs(noisy)[step] < lrs(clean)[step] <= lrs(plain)[step]
        event = noisy.steps()[step]
        assert event["lr"] == pytest.approx(lrs(plain)[step] * event["warmup_factor"])
    (claim,) = claims(noisy, "detected", "grad_variance")
    assert claim["details"]["factor"] < 0.5
    assert not claims(clean, "detected", "grad_variance")


@pytest.mark.slow
def test_a_too_hot_start_hurts_less_with_it(tmp_path: Path) -> None:
    """Over two seeds (one seed alone is a coin toss of where the swings fall)."""
    steps, harm_with, harm_without = 40, 0.0, 0.0
    for seed in (0, 1):
        clean = final_loss(warmup_run(tmp_path / f"clean-{seed}", steps, seed=seed))
        adaptive = warmup_run(tmp_path / f"adaptive-{seed}", steps, HOT_START, seed=seed)
        plain = warmup_run(
            tmp_path / f"plain-{seed}", steps, HOT_START, seed=seed, disable=("adaptive_warmup",)
        )
        assert claims(adaptive, "detected", "grad_variance")
        harm_with += final_loss(adaptive) - clean
        harm_without += final_loss(plain) - clean
        assert final_loss(plain) > 1.05 * clean  # without it the hot start costs the run
    assert harm_with < 0.5 * harm_without


@pytest.mark.slow
def test_resume_inside_warmup_is_bit_exact(tmp_path: Path, noisy_start: Journal) -> None:
    straight = noisy_start
    warmup_run(tmp_path / "split", WARMUP, NOISY_START, stop_after=10)
    split = warmup_run(tmp_path / "split", WARMUP, NOISY_START, resume=True)
    # Step 11's factor comes from norms seen before the stop: a resume that lost the
    # window would train it at factor 1.
    assert straight.steps()[11]["warmup_factor"] < 1.0
    assert lrs(split) == lrs(straight)
    assert split.losses() == straight.losses()
