"""A soak's plan: replayable from its seed, Poisson in its arrivals, valid in every fault,
and refused with a named reason when it cannot be drawn; shrinking finds what fails."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from faults.registry import kinds as registered_kinds
from harness.running.baseline import baseline_key
from harness.running.launch import reference_command
from harness.running.runner import target_steps
from harness.soak.plan import MAX_DURATION, SoakPlanError, arrival_steps, draw_plan, soak_kinds
from harness.soak.shrink import shrink
from harness.suites.scenario import TrainerSpec
from harness.suites.strategies import drawn_from_seed, fault_specs


def test_the_same_seed_draws_the_same_plan_and_another_seed_another() -> None:
    one = draw_plan(seed=7, steps=3000, rate=0.01, checkpoint_every=50)
    assert draw_plan(seed=7, steps=3000, rate=0.01, checkpoint_every=50) == one
    assert draw_plan(seed=8, steps=3000, rate=0.01, checkpoint_every=50) != one


def test_arrivals_come_at_the_asked_rate_in_increasing_steps() -> None:
    counts = []
    for seed in range(200):
        steps = arrival_steps(seed, 2000, 0.01)
        assert steps == sorted(set(steps)) and all(1 <= s <= 2000 for s in steps)
        counts.append(len(steps))
    # Poisson: mean 20 and variance 20; the mean of 200 runs is within 1.5 of 20.
    assert statistics.mean(counts) == pytest.approx(20, abs=1.5)
    assert statistics.variance(counts) == pytest.approx(20, rel=0.4)


@pytest.mark.slow
def test_every_fault_fires_once_briefly_and_acts_on_a_step() -> None:
    plan = draw_plan(seed=3, steps=20_000, rate=0.01, checkpoint_every=50)
    table = registered_kinds()
    assert len({f.kind for f in plan}) >= 10  # the kinds are spread
    for fault in plan:
        assert fault.at_step is not None and fault.every is None and fault.probability is None
        assert fault.after_seconds is None and fault.duration <= MAX_DURATION
        assert table[fault.kind].spec.reach == "step"


def test_kinds_limit_the_plan_and_unknown_or_undrawable_ones_are_refused() -> None:
    plan = draw_plan(seed=1, steps=2000, rate=0.02, kinds=["nan_grad", "kill"])
    assert {f.kind for f in plan} == {"nan_grad", "kill"}
    with pytest.raises(SoakPlanError, match=r"'nan_gard'.*expected some of"):
        draw_plan(seed=1, steps=100, rate=0.1, kinds=["nan_gard"])
    with pytest.raises(SoakPlanError, match="'duplicate_contamination' cannot be drawn"):
        draw_plan(seed=1, steps=100, rate=0.1, kinds=["duplicate_contamination"])
    assert "node_kill" not in soak_kinds() and "kill" in soak_kinds()


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan")])
def test_a_rate_out_of_range_is_refused(rate: float) -> None:
    with pytest.raises(SoakPlanError, match="fault rate"):
        arrival_steps(0, 100, rate)


def test_a_seeded_draw_is_the_same_each_time_and_varies_with_the_seed() -> None:
    specs = fault_specs(kinds=["bitflip"], max_step=500)
    assert drawn_from_seed(specs, 11) == drawn_from_seed(specs, 11)
    assert len({repr(drawn_from_seed(specs, s)) for s in range(20)}) > 10


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 40).flatmap(
        lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1, max_size=3))
    )
)
def test_shrinking_ends_on_a_failing_one_minimal_plan(case: tuple[int, set[int]]) -> None:
    n, culprits = case
    seen: list[tuple[int, ...]] = []

    def fails(plan: tuple[int, ...]) -> bool:
        seen.append(plan)
        return culprits <= set(plan)

    found = shrink(range(n), fails, max_trials=1000)
    assert found.complete and set(found.items) == culprits
    assert found.trials == len(seen)


def test_shrinking_stops_at_its_budget_with_the_smallest_failing_plan_seen() -> None:
    failing: list[tuple[int, ...]] = []

    def fails(plan: tuple[int, ...]) -> bool:
        broke = {3, 29} <= set(plan)
        if broke:
            failing.append(plan)
        return broke

    found = shrink(range(40), fails, max_trials=4)
    assert not found.complete and found.trials == 4
    assert {3, 29} <= set(found.items)
    assert found.items == (failing[-1] if failing else tuple(range(40)))


def test_stop_after_cuts_a_run_short_on_the_same_schedule_and_is_checked() -> None:
    cut = TrainerSpec(steps=400, stop_after=150)
    argv = reference_command(cut, Path("run"), None, stop_after=cut.stop_after)
    assert (
        argv[argv.index("--steps") + 1] == "400" and argv[argv.index("--stop-after") + 1] == "150"
    )
    assert target_steps(cut, None) == 150
    assert baseline_key(cut, code="c") != baseline_key(TrainerSpec(steps=400), code="c")
    for bad, said in [
        ({"steps": 100, "stop_after": 150}, "stop_after 150 is past steps 100"),
        ({"steps": 100, "stop_after": 50, "resume_after": 20}, "stop_after goes with neither"),
        ({"command": "python t.py", "stop_after": 5}, "stop_after apply to the reference"),
    ]:
        with pytest.raises(ValidationError, match=said):
            TrainerSpec(**bad)
