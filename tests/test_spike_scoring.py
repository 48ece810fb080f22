"""The scoring behind benchmarks/spike_detectors.py, on hand-labelled series whose every
figure is worked out by hand from the rules in `benchmarks.spike_scoring`, and the replay
that feeds it, on a synthetic curve with one spike and one drop."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.spike_detectors import onset, replay
from benchmarks.spike_scoring import Series, Spike, match, score
from reference_trainer.stability.loss_spikes import SpikeConfig

WINDOW, AFTERMATH = 5, 15


def steps(n: int) -> dict[int, float]:
    """A flat series of ``n`` steps (scoring reads only its length)."""
    return {s: 1.0 for s in range(1, n + 1)}


def test_firings_are_detections_ignored_or_false_alarms() -> None:
    spikes = (Spike(10), Spike(50))
    outcome = match([3, 11, 12, 20, 52, 90], spikes, window=WINDOW, aftermath=AFTERMATH)
    # 3: before any spike; 11: the spike at 10, one step late; 12: in the same window;
    # 20: within the aftermath of a detected spike; 52: the spike at 50; 90: nothing near.
    assert outcome.detected == {10: 1, 50: 2}
    assert outcome.ignored == [12, 20]
    assert outcome.false_alarms == [3, 90]


def test_a_firing_past_the_window_misses_and_is_a_false_alarm() -> None:
    outcome = match([16, 20], [Spike(10)], window=WINDOW, aftermath=AFTERMATH)
    # The aftermath only forgives firings after a detection; this spike was never detected.
    assert outcome.detected == {} and outcome.false_alarms == [16, 20]


def test_steps_shared_with_another_series_are_not_counted() -> None:
    outcome = match([4, 30], [Spike(30)], window=WINDOW, aftermath=AFTERMATH, shared_until=30)
    assert outcome.ignored == [4] and outcome.detected == {30: 0} and not outcome.false_alarms


def test_precision_recall_false_alarm_rate_and_delay() -> None:
    series = [
        Series("faulted", steps(100), (Spike(10), Spike(50), Spike(70))),
        Series("clean", steps(200)),
    ]
    firings = {"faulted": [3, 11, 12, 20, 52, 90], "clean": [40, 41]}
    result = score(firings, series, window=WINDOW, aftermath=AFTERMATH)
    # Detected 10 (delay 1) and 50 (delay 2), missed 70; false alarms 3, 90, 40, 41.
    assert (result.labelled, result.detected, result.false_alarms) == (3, 2, 4)
    assert result.precision == pytest.approx(2 / 6)
    assert result.recall == pytest.approx(2 / 3)
    assert result.delays == [1, 2] and result.median_delay == 1.5
    assert result.clean_steps == 200 and result.clean_false_alarms == 2
    assert result.false_alarms_per_1000_clean_steps == pytest.approx(10.0)
    assert [delay for _, delay in result.spikes] == [1, 2, None]


def test_a_detector_that_never_fires_has_no_precision_and_no_recall() -> None:
    result = score({}, [Series("faulted", steps(50), (Spike(10),))], window=5, aftermath=15)
    assert result.precision is None and result.recall == 0
    assert result.false_alarms_per_1000_clean_steps is None and result.median_delay is None


def test_bad_windows_are_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        match([], [], window=10, aftermath=5)


def test_onsets_follow_where_each_fault_shows_in_the_loss() -> None:
    assert onset({"kind": "bad_batch", "at_step": 40}) == 40  # its own step's loss
    assert onset({"kind": "lr_spike", "at_step": 40}) == 41  # the update shows next step


def test_replay_sorts_firings_by_detector_and_side() -> None:
    t = np.arange(1, 151)
    curve = 2 + 5 * np.exp(-t / 40) + np.random.default_rng(0).normal(0, 0.05, len(t))
    curve[99] *= 2.0  # step 100: a spike
    curve[119] *= 0.5  # step 120: a drop
    losses = dict(zip(t.tolist(), curve.tolist(), strict=True))
    fired = replay(Series("synthetic", losses), SpikeConfig())
    assert fired["forecast above"] == [100]
    assert fired["forecast below"] == [120]
    # It scores rises only: silent at the drop itself (what it does after one is its own
    # story: the dropped loss becomes its baseline).
    assert fired["robust_zscore"][0] == 100 and 120 not in fired["robust_zscore"]
    assert fired["early_max"] == []
