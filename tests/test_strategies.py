"""The public Hypothesis strategies: every draw is valid, the bias is real, swarm concentrates."""

from __future__ import annotations

import ast
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from faults.bitflip import LAYOUTS
from faults.plan import FaultPlan
from faults.registry import kinds, parse_fault
from faults.spec import FaultSpec
from harness.suites.strategies import bit_positions, fault_plans, fault_specs, ranks, steps

T = TypeVar("T")
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def draws(strategy: SearchStrategy[T], n: int, per_example: int = 25) -> list[T]:
    """About ``n`` values of ``strategy``, from derandomized examples (so never flaky)."""
    batches: list[list[T]] = []

    @settings(
        max_examples=n // per_example + 1,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(strategy, min_size=per_example, max_size=per_example))
    def collect(batch: list[T]) -> None:
        batches.append(batch)

    collect()
    # Hypothesis runs the simplest example (every choice minimal) first: not a random draw.
    return [x for batch in batches[1:] for x in batch]


def frequencies(values: list[Any]) -> dict[Any, float]:
    """Share of each value among ``values``."""
    return {v: c / len(values) for v, c in Counter(map(repr, values)).items()}


# -- validity ------------------------------------------------------------------------------


def check_spec(spec: FaultSpec, max_step: int, world_size: int) -> None:
    """What every drawn spec promises."""
    assert parse_fault(spec.model_dump(mode="json")) == spec  # passes its own validation
    assert isinstance(spec.seed, int)
    if isinstance(spec.ranks, list):
        assert spec.ranks and all(0 <= r < world_size for r in spec.ranks)
    if spec.after_seconds is None:
        assert any(spec.fires_at(s) for s in range(1, max_step + 1)), spec
    if spec.kind in ("duplicate_contamination", "tokenizer_stress"):
        assert spec.at_step == 1 and spec.every is None


@FEW
@given(fault_specs(max_step=30, world_size=4, checkpoint_every=10, timed=True))
def test_every_drawn_spec_is_valid(spec: FaultSpec) -> None:
    check_spec(spec, 30, 4)


@FEW
@given(fault_plans(max_faults=5, max_step=40, world_size=3, checkpoint_every=8))
def test_every_drawn_plan_is_valid_and_round_trips(plan: FaultPlan) -> None:
    assert FaultPlan.from_dict(plan.to_dict()) == plan
    assert len(plan) <= 5
    # The agent refuses two faults on the document stream.
    assert sum(s.kind in ("duplicate_contamination", "tokenizer_stress") for s in plan) <= 1
    for spec in plan:
        check_spec(spec, 40, 3)


@FEW
@given(fault_plans(kinds=["duplicate_contamination"], max_faults=4))
def test_duplicate_contamination_alone_gives_at_most_one(plan: FaultPlan) -> None:
    assert len(plan) <= 1


@FEW
@given(fault_plans(kinds=["duplicate_contamination", "tokenizer_stress"], max_faults=4))
def test_the_document_stream_kinds_together_give_at_most_one(plan: FaultPlan) -> None:
    assert len(plan) <= 1


@FEW
@given(fault_specs(kinds=["activation_overflow", "nan_grad"], targets=["blocks.*", "head"]))
def test_target_kinds_use_the_given_globs(spec: FaultSpec) -> None:
    assert getattr(spec, "target", None) in {"blocks.*", "head"}


@pytest.mark.parametrize("dtype", sorted(str(d).removeprefix("torch.") for d in LAYOUTS))
def test_bit_positions_fit_each_dtype(dtype: str) -> None:
    width = next(lay.width for d, lay in LAYOUTS.items() if str(d).endswith(dtype))
    for bit in draws(bit_positions(dtype=dtype), 100):
        assert bit in ("sign", "exponent", "mantissa") or 0 <= int(bit) < width


def test_every_registered_kind_is_reachable() -> None:
    seen = {spec.kind for spec in draws(fault_specs(), 400, per_example=10)}
    # Node faults name a Docker node and act from outside the trainer: not drawn for plans.
    nodes = {name for name, kind in kinds().items() if kind.spec.reach == "node"}
    assert nodes == {"node_kill", "node_stop", "node_pause"}
    assert seen == set(kinds()) - nodes, set(kinds()) - nodes - seen


# -- bias ----------------------------------------------------------------------------------


def test_steps_favour_first_last_and_save_steps() -> None:
    share = frequencies(draws(steps(max_step=100, checkpoint_every=20), 1000))
    for special in (1, 20, 40, 60, 80, 100):
        assert share.get(repr(special), 0) > 0.05, (special, share)  # uniform would be 1%
    assert sum(share.get(repr(s), 0) for s in (21, 41, 61, 81)) > 0.1  # just after a save


def test_bit_positions_favour_exponent_bits() -> None:
    bits = draws(bit_positions(dtype="float16"), 500)
    exponent = [b for b in bits if b == "exponent" or (isinstance(b, int) and 10 <= b <= 14)]
    assert len(exponent) / len(bits) > 0.6  # uniform over 16 bits would be 31%


def test_ranks_favour_rank_zero() -> None:
    share = frequencies(draws(ranks(world_size=8), 500))
    assert share[repr([0])] > 0.1  # uniform over the 255 non-empty subsets would be 0.4%
    assert share[repr([7])] > 0.05 and share[repr("all")] > 0.05


def test_swarm_concentrates_plans_on_few_kinds() -> None:
    def mean_kinds(swarm: bool) -> float:
        plans = draws(fault_plans(min_faults=4, max_faults=4, swarm=swarm), 100, per_example=10)
        return sum(len({s.kind for s in p}) for p in plans) / len(plans)

    on, off = mean_kinds(True), mean_kinds(False)
    assert on < off - 0.5, (on, off)


# -- arguments -----------------------------------------------------------------------------

BAD: list[tuple[Callable[..., Any], dict[str, Any], str]] = [
    (fault_specs, {"kinds": ["nan_grad", "no_such_kind"]}, "no_such_kind.*nan_grad"),
    (fault_specs, {"kinds": "nan_grad"}, "kinds"),
    (fault_specs, {"kinds": []}, "kinds"),
    (fault_specs, {"max_step": 0}, "max_step"),
    (fault_specs, {"world_size": 0}, "world_size"),
    (fault_specs, {"checkpoint_every": 0}, "checkpoint_every"),
    (fault_specs, {"targets": ()}, "targets"),
    (fault_specs, {"timed": "yes"}, "timed"),
    (fault_specs, {"dtype": "int8"}, "dtype"),
    (fault_plans, {"min_faults": 3, "max_faults": 2}, "min_faults"),
    (fault_plans, {"max_faults": -1}, "max_faults"),
    (fault_plans, {"kinds": ["duplicate_contamination"], "min_faults": 2}, "min_faults"),
    (fault_plans, {"kinds": ["tokenizer_stress"], "min_faults": 2}, "min_faults"),
    (fault_plans, {"swarm": 1}, "swarm"),
    (steps, {"max_step": 0}, "max_step"),
    (steps, {"max_step": True}, "max_step"),
    (ranks, {"world_size": 0}, "world_size"),
    (bit_positions, {"dtype": "float8"}, "dtype"),
]


@pytest.mark.parametrize(("strategy", "kwargs", "names"), BAD)
def test_bad_arguments_raise_at_once(
    strategy: Callable[..., Any], kwargs: dict[str, Any], names: str
) -> None:
    with pytest.raises(InvalidArgument, match=names):
        strategy(**kwargs)  # at the call, before any draw


def test_only_the_strategies_module_imports_hypothesis() -> None:
    root = Path(__file__).resolve().parent.parent
    for path in [*(root / "harness").rglob("*.py"), *(root / "faults").rglob("*.py")]:
        if path.name == "strategies.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "hypothesis" for n in names), path


# -- what a user writes --------------------------------------------------------------------


def train(plan: FaultPlan, steps: int) -> float:
    """A toy training loop with the guard under test: skip a step whose gradient is not finite."""
    w = 1.0
    for step in range(1, steps + 1):
        grad = 2 * w  # d/dw of w**2
        for spec in plan:
            if spec.active_at(step):
                grad = math.nan if spec.kind == "nan_grad" else math.inf
        if math.isfinite(grad):
            w -= 0.1 * grad
    return w


@settings(max_examples=50, deadline=None)
@given(fault_plans(kinds=["nan_grad", "inf_grad"], max_step=20))
def test_example_guard_survives_poisoned_gradients(plan: FaultPlan) -> None:
    for spec in plan:
        first = next(s for s in range(1, 21) if spec.fires_at(s))  # every fault fires in [1, 20]
        assert spec.active_at(first)
    assert math.isfinite(train(plan, steps=20))
