"""Property tests against the reference trainer itself: whatever plan of up to three faults
`harness.suites.strategies` draws (each fired once, at its drawn step, as a soak fires
them), the trainer on two ranks under torchrun keeps every invariant of the soak."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from faults.plan import FaultPlan
from harness.running.runner import Runner, RunOptions
from harness.soak.plan import at_step, soak_kinds
from harness.suites.scenario import Expect, Scenario, TrainerSpec
from harness.suites.strategies import fault_plans

STEPS, EVERY = 40, 10
_runs = itertools.count()


def _once(plan: FaultPlan) -> FaultPlan:
    """Each drawn fault fired once at its drawn step (a step of the run for the others)."""
    return FaultPlan(
        tuple(at_step(f, f.at_step or f.every or STEPS // 2, "drawn fault") for f in plan)
    )


@pytest.mark.slow
@pytest.mark.distributed
@settings(
    max_examples=3,
    deadline=None,
    database=None,
    derandomize=True,  # the same three plans in every CI run; soaks explore other seeds
    phases=[Phase.generate],  # no shrinking: each example is a real two-rank run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    plan=fault_plans(
        kinds=soak_kinds(), min_faults=1, max_faults=3, max_step=STEPS, checkpoint_every=EVERY
    ).map(_once)
)
def test_the_reference_trainer_keeps_the_soak_invariants_under_drawn_plans(
    plan: FaultPlan, tmp_path: Path
) -> None:
    name = f"drawn-{next(_runs)}"
    scenario = Scenario(
        name=name,
        trainer=TrainerSpec(
            world_size=2,
            steps=STEPS,
            checkpoint_every=EVERY,
            max_restarts=2 * len(plan) + 2,
            timeout=400,
        ),
        faults=list(plan),
        expect=Expect(
            completed=True,
            kept_params_finite=True,
            no_corrupt_checkpoint_loaded=True,
            max_stall_seconds=60,
            no_processes_left=True,
        ),
    )
    result = Runner(RunOptions(out_dir=tmp_path / name)).scenario(scenario)
    shown = [f.model_dump(exclude_defaults=True) | {"kind": f.kind} for f in plan]
    assert result.error is None, (shown, result.error, result.log_tail[-2000:])
    # A check with nothing to judge (no checkpoint was ever loaded) holds vacuously here.
    broken = [(c.name, c.detail) for c in result.checks if c.status == "failed"]
    assert not broken, (shown, broken)
