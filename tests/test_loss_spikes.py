"""Loss-spike detectors on synthetic loss curves: hits, silence, non-finite, resume, RNG.

Curves are ``2 + 5·exp(-t/40)`` plus seeded Gaussian noise over 200 steps, with spikes
(x1.5 to x3, 1 to 3 steps) put at a known step >= 60. The forecaster is the slow one
(milliseconds per step), so its spiked curves replay only from the spike on, starting from
its saved state at that step of the clean run of the same seed: the same claims as a full
run, as `test_a_restored_detector_continues_identically` shows.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from reference_trainer.stability.loss_spikes import (
    EarlyMaxConfig,
    EarlyMaxDetector,
    ForecastConfig,
    ForecastDetector,
    LossSpikeDetector,
    RobustZScoreConfig,
    RobustZScoreDetector,
    SpikeClaim,
    SpikeConfig,
    SpikeMonitor,
    build_detectors,
)

SEEDS = range(5)
STEPS = 200
MAKERS: dict[str, Callable[[], LossSpikeDetector]] = {
    "robust_zscore": RobustZScoreDetector,
    "early_max": EarlyMaxDetector,
    "forecast": ForecastDetector,
}
# (noise sigma, spike factor, spike length): from a small spike on a quiet curve to a
# large one on a noisy curve.
SPIKES = [(0.05, 1.5, 1), (0.1, 2.0, 2), (0.15, 3.0, 3)]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny LSTM steps are slower, not faster, with several threads on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def loss_curve(seed: int, sigma: float = 0.1, steps: int = STEPS) -> np.ndarray:
    """``2 + 5·exp(-t/40)`` plus Gaussian noise: a typical falling training loss."""
    t = np.arange(steps)
    return 2 + 5 * np.exp(-t / 40) + np.random.default_rng(seed).normal(0, sigma, steps)


def spike_step(seed: int) -> int:
    """A spike position in [60, 180) that varies with the seed."""
    return 60 + (37 * seed) % 120


def spiked(
    seed: int, sigma: float, factor: float, length: int, at: int | None = None
) -> tuple[np.ndarray, int]:
    """The clean curve of ``seed`` with ``length`` steps multiplied by ``factor``."""
    losses = loss_curve(seed, sigma)
    at = spike_step(seed) if at is None else at
    losses[at : at + length] *= factor
    return losses, at


def claims(detector: Any, losses: np.ndarray, start: int = 0) -> list[SpikeClaim]:
    """Every claim the detector makes over ``losses`` (steps numbered from ``start``)."""
    found = [detector.observe(start + i, float(x)) for i, x in enumerate(losses)]
    return [c for c in found if c is not None]


def clean_claim_steps(name: str, seed: int, sigma: float) -> list[int]:
    """Steps a fresh detector claims on the clean curve."""
    if name == "forecast" and sigma == 0.1:
        return clean_forecast_run(seed)[0]
    return [c.step for c in claims(MAKERS[name](), loss_curve(seed, sigma))]


# Steps from which the tests below replay the forecaster's clean runs.
REPLAY_FROM = {3, 40, 100} | {spike_step(seed) for seed in SEEDS}


@functools.cache
def clean_forecast_run(seed: int) -> tuple[list[int], dict[int, dict[str, Any]]]:
    """A fresh forecaster's claim steps on the clean curve (sigma 0.1), and its state just
    before each step of ``REPLAY_FROM``."""
    detector, steps, states = ForecastDetector(), [], {}
    for i, x in enumerate(loss_curve(seed, 0.1)):
        if i in REPLAY_FROM:
            states[i] = detector.state_dict()
        if detector.observe(i, float(x)) is not None:
            steps.append(i)
    return steps, states


def forecaster_at(seed: int, step: int) -> ForecastDetector:
    """The forecaster of the clean run of ``seed`` just before ``step``."""
    detector = ForecastDetector()
    detector.load_state_dict(clean_forecast_run(seed)[1][step])
    return detector


# -- hits and silence ----------------------------------------------------------------------


def _fires_at(name: str, seed: int, sigma: float, factor: float, length: int) -> None:
    losses, at = spiked(seed, sigma, factor, length)
    steps = [c.step for c in claims(MAKERS[name](), losses)]
    assert steps and steps[0] == at, (name, seed, at, steps)  # latency 0 (patience 1)
    assert set(steps) <= set(range(at, at + length)), (name, seed, at, steps)


@pytest.mark.parametrize(("sigma", "factor", "length"), SPIKES)
def test_robust_zscore_fires_at_the_spike_and_nowhere_else(
    sigma: float, factor: float, length: int
) -> None:
    for seed in SEEDS:
        _fires_at("robust_zscore", seed, sigma, factor, length)


@pytest.mark.parametrize("seed", SEEDS)
def test_forecast_fires_at_the_spike_and_nowhere_else(seed: int) -> None:
    _, factor, length = SPIKES[seed % len(SPIKES)]
    losses, at = spiked(seed, 0.1, factor, length)
    assert [s for s in clean_forecast_run(seed)[0] if s < at] == []
    steps = [c.step for c in claims(forecaster_at(seed, at), losses[at:], start=at)]
    assert steps and steps[0] == at, (seed, at, steps)
    assert set(steps) <= set(range(at, at + length)), (seed, at, steps)


def test_false_alarms_on_clean_curves() -> None:
    sigmas = {"robust_zscore": (0.05, 0.1, 0.15), "early_max": (0.05, 0.15), "forecast": (0.1,)}
    counts = {
        name: sum(len(clean_claim_steps(name, seed, sigma)) for seed in SEEDS for sigma in sigmas)
        for name, sigmas in sigmas.items()
    }
    assert counts["robust_zscore"] == 0
    assert counts["early_max"] == 0
    assert counts["forecast"] <= len(SEEDS) * STEPS // 1000, counts


@pytest.mark.parametrize("name", MAKERS)
def test_a_clean_curve_gives_no_claims_at_all(name: str) -> None:
    assert clean_claim_steps(name, 0, 0.1) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_a_small_bump_does_not_fire(seed: int) -> None:
    losses, at = spiked(seed, 0.1, 1.05, 1, at=100)
    assert claims(RobustZScoreDetector(), losses) == []
    assert claims(forecaster_at(seed, at), losses[at : at + 20], start=at) == []


def test_early_max_is_blind_below_its_factor_but_fires_above_it() -> None:
    """Known blind spot: 10x the early maximum is far above any ordinary spike."""
    for seed in SEEDS:
        losses, at = spiked(seed, 0.1, 3.0, 3)
        assert claims(EarlyMaxDetector(), losses) == []
        losses[at] = 9 * losses[:10].max()
        assert claims(EarlyMaxDetector(), losses) == []
        losses[at] = 12 * losses[:10].max()
        found = claims(EarlyMaxDetector(), losses)
        assert [c.step for c in found] == [at]
        assert found[0].details["threshold"] == pytest.approx(10 * losses[:10].max())
        assert found[0].details["early_max"] == losses[:10].max()


def test_claims_carry_the_figures_that_made_them() -> None:
    losses, at = spiked(1, 0.1, 2.0, 1)
    robust = claims(RobustZScoreDetector(), losses[: at + 1])[0].details
    assert robust["z"] > 6 and robust["patience_count"] == 1
    assert robust["mad"] > 0 and robust["non_finite"] == 0
    forecast = claims(forecaster_at(1, at), losses[at : at + 1], start=at)[0]
    details = forecast.details
    assert details["band_low"] < details["forecast_mean"] < details["band_high"] < forecast.loss
    assert details["band_high"] == pytest.approx(
        details["forecast_mean"] + 3 * details["forecast_std"]
    )
    assert abs(details["forecast_mean"] - losses[at] / 2) < 0.5  # it predicted the clean loss


@pytest.mark.parametrize("seed", SEEDS)
def test_forecast_fires_below_on_a_drop_where_an_above_only_band_is_silent(seed: int) -> None:
    losses, at = spiked(seed, 0.1, 0.5, 1)  # one loss at half its level
    found = claims(forecaster_at(seed, at), losses[at : at + 30], start=at)
    assert [(c.step, c.side) for c in found] == [(at, "below")]  # and not after it
    details = found[0].details
    assert found[0].loss < details["band_low"] < details["forecast_mean"]
    # The same figures under the one-sided rule: the loss is far under band_high.
    assert not found[0].loss > details["band_high"]
    assert found[0].journal_details()["side"] == "below"


def test_a_spike_is_claimed_above() -> None:
    losses, at = spiked(1, 0.1, 2.0, 1)
    (claim,) = claims(forecaster_at(1, at), losses[at : at + 30], start=at)
    assert (claim.step, claim.side) == (at, "above")
    assert claim.journal_details()["side"] == "above"
    # The other detectors have no band sides: their journaled details carry no side.
    robust = claims(RobustZScoreDetector(), losses[: at + 1])[0]
    assert robust.side is None and "side" not in robust.journal_details()


@pytest.mark.parametrize("factor", [1.6, 0.6])
def test_a_lasting_shift_becomes_the_new_level(factor: float) -> None:
    """After ``relearn_after`` claims in a row it learns the shifted losses and goes quiet;
    a forecaster that never relearns keeps firing for the whole shift."""
    losses, at = spiked(2, 0.1, factor, 80, at=100)
    relearns = forecaster_at(2, at)
    stubborn = ForecastDetector(ForecastConfig(relearn_after=1000))
    stubborn.load_state_dict(clean_forecast_run(2)[1][at])
    during = range(at, at + 80)
    quick = [c.step for c in claims(relearns, losses[at:], start=at) if c.step in during]
    slow = [c.step for c in claims(stubborn, losses[at:], start=at) if c.step in during]
    assert len(slow) >= 75  # nearly every one of the 80 shifted steps
    n = relearns.config.relearn_after
    assert quick[: n + 1] == list(range(at, at + n + 1))  # every step until it relearns
    assert len(quick) < 2 * n  # then quiet, or nearly


def test_the_monitor_acts_on_the_sides_it_is_told() -> None:
    above = SpikeClaim("forecast", 5, 9.0, {}, "above")
    below = SpikeClaim("forecast", 5, 1.0, {}, "below")
    config = SpikeConfig(acting=("robust_zscore", "early_max", "forecast"))
    assert SpikeMonitor(config).acting([above]) and not SpikeMonitor(config).acting([below])
    config.acting_sides = ("above", "below")
    assert SpikeMonitor(config).acting([below])
    assert not SpikeMonitor(SpikeConfig(acting=("robust_zscore",))).acting([above, below])
    non_finite = SpikeClaim("forecast", 5, math.nan, {"non_finite": 1.0})
    config.acting_sides = ()
    assert SpikeMonitor(config).acting([non_finite]) and not SpikeMonitor(config).acting([above])


# -- non-finite losses and patience --------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("at", [3, 100])
def test_a_non_finite_loss_fires_every_detector(bad: float, at: int) -> None:
    losses = loss_curve(2, 0.1)[: at + 30]
    losses[at] = bad
    for name, make in MAKERS.items():
        if name == "forecast":
            found = claims(forecaster_at(2, at), losses[at:], start=at)
        else:
            found = claims(make(), losses)
        assert [c.step for c in found] == [at], name  # and the history is not polluted
        assert found[0].detector == name and found[0].details["non_finite"] == 1


@pytest.mark.parametrize(("length", "fires"), [(2, False), (3, True)])
def test_patience_needs_consecutive_exceedances(length: int, fires: bool) -> None:
    for seed in SEEDS:
        losses, at = spiked(seed, 0.1, 2.0, length)
        found = claims(RobustZScoreDetector(RobustZScoreConfig(patience=3)), losses)
        if fires:
            assert [c.step for c in found] == [at + 2]
            assert found[0].details["patience_count"] == 3
        else:
            assert found == []


def test_a_spike_does_not_enter_the_robust_window() -> None:
    losses, at = spiked(3, 0.1, 2.0, 3)
    detector = RobustZScoreDetector()
    claims(detector, losses[: at + 3])
    assert max(detector.window) < 1.5 * losses[at - 1]


# -- state -------------------------------------------------------------------------------


def _through_a_checkpoint(state: dict[str, object]) -> dict[str, object]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, object] = torch.load(buffer, weights_only=True)
    return loaded


@pytest.mark.parametrize("name", ["robust_zscore", "early_max", "monitor"])
def test_a_restored_detector_continues_identically(name: str) -> None:
    losses, _ = spiked(4, 0.1, 2.0, 2, at=130)
    losses[160] = 12 * losses[:10].max()
    losses[170] = math.nan
    make = SpikeMonitor if name == "monitor" else MAKERS[name]  # the monitor runs all three
    first = make()
    for i, x in enumerate(losses[:100]):
        first.observe(i, float(x))
    state = _through_a_checkpoint(first.state_dict())
    ahead = [first.observe(100 + i, float(x)) for i, x in enumerate(losses[100:])]
    second = make()
    second.load_state_dict(state)
    behind = [second.observe(100 + i, float(x)) for i, x in enumerate(losses[100:])]
    assert any(ahead)
    # same steps, losses and figures to the last bit (repr: a NaN loss equals itself)
    assert repr(behind) == repr(ahead)


def test_a_saved_forecaster_state_is_a_snapshot() -> None:
    """The state stays as saved while training goes on (checkpoints may be written later)."""
    losses = loss_curve(5, 0.1)
    first, second = ForecastDetector(), ForecastDetector(ForecastConfig(seed=99))
    claims(first, losses[:80])
    state = first.state_dict()
    claims(first, losses[80:100], start=80)
    second.load_state_dict(state)
    claims(second, losses[80:100], start=80)
    assert first.pending == second.pending and first.pending
    for a, b in zip(first.net.parameters(), second.net.parameters(), strict=True):
        assert torch.equal(a, b)


def test_reset_forgets_history() -> None:
    losses, at = spiked(0, 0.1, 2.0, 1)
    losses[at + 20] = 12 * losses[:10].max()
    losses = losses[: at + 30]
    for make in MAKERS.values():
        used = make()
        claims(used, loss_curve(7, 0.15)[:150:-1])  # a rising curve: nothing like the next one
        used.reset()
        fresh = claims(make(), losses)
        assert fresh and claims(used, losses) == fresh


def test_states_of_other_detectors_are_refused() -> None:
    with pytest.raises(ValueError, match="early_max"):
        RobustZScoreDetector().load_state_dict(EarlyMaxDetector().state_dict())


# -- the forecaster and global state -------------------------------------------------------


def test_forecaster_leaves_the_global_rng_and_threads_alone() -> None:
    torch.manual_seed(1234)
    before, threads = torch.get_rng_state(), torch.get_num_threads()
    detector = ForecastDetector()
    claims(detector, spiked(0, 0.1, 2.0, 1)[0][:80])
    detector.reset()
    claims(detector, loss_curve(1)[:40])
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.get_num_threads() == threads
    assert torch.is_grad_enabled()


def test_forecaster_is_seeded() -> None:
    losses = loss_curve(6, 0.1)[:40]
    a, b, c = ForecastDetector(), ForecastDetector(), ForecastDetector(ForecastConfig(seed=1))
    for detector in (a, b, c):
        claims(detector, losses)
    assert a.pending == b.pending
    assert a.pending != c.pending


def test_forecaster_works_under_no_grad() -> None:
    losses, at = spiked(0, 0.1, 2.0, 1)
    expected = claims(forecaster_at(0, at - 20), losses[at - 20 : at + 10], start=at - 20)
    with torch.no_grad():
        found = claims(forecaster_at(0, at - 20), losses[at - 20 : at + 10], start=at - 20)
    assert [c.step for c in expected] == [at]
    assert found == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_robust_zscore_catches_a_level_shift_that_no_single_step_scores(seed: int) -> None:
    """A lasting 15% rise on a quiet curve, at the trainer's spike threshold (8): each change
    is inside the noise the spike test allows (no claim with the level check off), but the
    recent median sits far above the one before it: one level claim, within two level
    windows, then the new level is kept."""
    losses, at = spiked(seed, 0.05, 1.15, 80, at=100)
    off = RobustZScoreConfig(z_threshold=8.0, level_window=0)
    assert claims(RobustZScoreDetector(off), losses) == []
    found = claims(RobustZScoreDetector(RobustZScoreConfig(z_threshold=8.0)), losses)
    k = RobustZScoreConfig().level_window
    assert [c.details.get("level_shift") for c in found] == [1.0], found
    (claim,) = found
    assert at <= claim.step <= at + 2 * k
    assert claim.details["level_recent"] > claim.details["level_before"]
    assert claim.details["z"] > claim.details["threshold"]


# -- configuration and the monitor ---------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: RobustZScoreConfig(window=3), "spikes.robust.window"),
        (lambda: RobustZScoreConfig(z_threshold=0), "spikes.robust.z_threshold"),
        (lambda: RobustZScoreConfig(patience=0), "spikes.robust.patience"),
        (lambda: RobustZScoreConfig(min_history=60), "spikes.robust.min_history"),
        (lambda: RobustZScoreConfig(level_window=30), "spikes.robust.level_window"),
        (lambda: RobustZScoreConfig(level_threshold=0), "spikes.robust.level_threshold"),
        (lambda: EarlyMaxConfig(early_steps=0), "spikes.early_max.early_steps"),
        (lambda: EarlyMaxConfig(factor=1.0), "spikes.early_max.factor"),
        (lambda: ForecastConfig(context=0), "spikes.forecast.context"),
        (lambda: ForecastConfig(sigma_k=-1), "spikes.forecast.sigma_k"),
        (lambda: ForecastConfig(min_history=10), "spikes.forecast.min_history"),
        (lambda: ForecastConfig(norm_decay=1.0), "spikes.forecast.norm_decay"),
        (lambda: SpikeConfig(enabled=("robust_zscore", "spike_oracle")), "spikes.enabled"),
        (lambda: SpikeConfig(enabled=("robust_zscore",)), "spikes.acting"),
        (lambda: SpikeConfig(acting_sides=("up",)), "spikes.acting_sides"),  # type: ignore[arg-type]
        (lambda: ForecastConfig(relearn_after=0), "spikes.forecast.relearn_after"),
    ],
)
def test_config_errors_name_the_field(make: Callable[[], object], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make()


def test_the_monitor_revalidates_a_changed_config() -> None:
    config = SpikeConfig()
    config.enabled = ("early_max",)  # acting still names robust_zscore
    with pytest.raises(ValueError, match="acting"):
        SpikeMonitor(config)
    config.acting = ()
    assert [d.name for d in SpikeMonitor(config).detectors] == ["early_max"]


def test_only_acting_detectors_trigger_recovery() -> None:
    detectors = build_detectors(SpikeConfig())
    assert [d.name for d in detectors] == list(MAKERS)
    assert all(isinstance(d, LossSpikeDetector) for d in detectors)
    monitor = SpikeMonitor()
    forecast_only = [SpikeClaim("forecast", 5, 9.0, {})]
    assert not monitor.acting(forecast_only)
    assert monitor.acting([*forecast_only, SpikeClaim("early_max", 5, 9.0, {})])
    assert SpikeMonitor(SpikeConfig(acting=("forecast",))).acting(forecast_only)
    losses, at = spiked(0, 0.1, 2.0, 1)
    found = [monitor.observe(i, float(x)) for i, x in enumerate(losses[:100])]
    fired = {c.detector for step_claims in found for c in step_claims}
    assert fired == {"robust_zscore", "forecast"}
    assert monitor.acting(found[at]) and [s for s, f in enumerate(found) if f] == [at]
