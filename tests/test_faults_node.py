"""Node faults: they honour only the triggers the harness can meet from outside the trainer
(a step it reads in the journal, or a time), and act through the injector protocol on
whatever `NodeControl` the harness hands them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from faults import FaultSpecError, StepContext, build_injector, kinds, parse_fault
from harness.suites.suite_loader import ScenarioError, load_suite

NODE_KINDS = ("node_kill", "node_stop", "node_pause")


class FakeNodes:
    """A `NodeControl` that records what it was asked to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def fault(self, action: str, node: int, *, timeout: float) -> dict[str, Any]:
        self.calls.append(("fault", action, node, timeout))
        return {"action": action, "node": node}

    def restore(self, action: str, node: int) -> None:
        self.calls.append(("restore", action, node))


def test_node_kinds_declare_where_they_act_and_the_triggers_they_honour() -> None:
    reach = {name: kind.spec.reach for name, kind in kinds().items()}
    assert {name for name, where in reach.items() if where == "node"} == set(NODE_KINDS)
    for name in NODE_KINDS:
        spec = kinds()[name].spec
        assert spec.fault_class == "process"
        assert spec.triggers == ("at_step", "after_seconds")


@pytest.mark.parametrize("kind", NODE_KINDS)
@pytest.mark.parametrize(
    ("when", "field"),
    [
        ({"at_step": 5, "every": 5}, "every"),
        ({"every": 3}, "every"),
        ({"probability": 0.5}, "probability"),
    ],
)
def test_a_trigger_a_node_fault_cannot_honour_is_refused_naming_it(
    kind: str, when: dict[str, Any], field: str
) -> None:
    with pytest.raises(FaultSpecError) as caught:
        parse_fault({"kind": kind, "node": 1, **when}, "plan.faults[0]")
    assert str(caught.value).startswith(
        f"plan.faults[0].{field}: Value error, {kind} honours at_step or after_seconds only, "
        f"not {field}"
    )


@pytest.mark.parametrize("when", [{"at_step": 5}, {"after_seconds": 2.5}])
def test_the_triggers_a_node_fault_honours_validate(when: dict[str, Any]) -> None:
    spec = parse_fault({"kind": "node_kill", "node": 1, **when})
    assert spec.target_node() == 1 and spec.reach == "node"


def test_a_suite_with_a_node_fault_on_every_or_probability_is_refused(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        """\
suite: nodes
scenarios:
  - name: a
    trainer: {launcher: docker, nodes: 2, world_size: 2}
    faults:
      - {kind: node_kill, at_step: 5, every: 5, node: 1}
      - {kind: node_pause, probability: 0.5, node: 1}
    expect: {completed: true}
"""
    )
    with pytest.raises(ScenarioError) as caught:
        load_suite(suite)
    assert caught.value.problems == [
        f"{suite}:6: scenarios[0].faults[0].every: node_kill honours at_step or "
        "after_seconds only, not every (got 5)",
        f"{suite}:7: scenarios[0].faults[1].probability: node_pause honours at_step or "
        "after_seconds only, not probability (got 0.5)",
    ]


def test_every_step_kind_honours_every_trigger() -> None:
    for kind in kinds().values():
        if kind.spec.reach == "step":
            assert kind.spec.triggers == ("at_step", "every", "probability", "after_seconds")
    spec = parse_fault({"kind": "nan_grad", "every": 3})
    assert spec.target_node() is None


@pytest.mark.parametrize(
    ("fault", "timeout", "restore_after"),
    [
        ({"kind": "node_kill", "rejoin_after": 20}, 10.0, 20),
        ({"kind": "node_stop", "grace_seconds": 3}, 3.0, None),
        ({"kind": "node_pause", "resume_after": 4}, 10.0, 4),
        ({"kind": "node_pause"}, 10.0, None),
    ],
)
def test_the_injector_acts_on_the_node_through_the_harness_controls(
    fault: dict[str, Any], timeout: float, restore_after: float | None
) -> None:
    spec = parse_fault({**fault, "at_step": 5, "node": 1})
    injector = build_injector(spec)
    nodes = FakeNodes()
    (record,) = injector.on_node(nodes)
    action = {"node_kill": "kill", "node_stop": "stop", "node_pause": "pause"}[spec.kind]
    assert nodes.calls == [("fault", action, 1, timeout)]
    assert (record.fault, record.target, record.details) == (
        spec.kind,
        "node 1",
        {"action": action, "node": 1},
    )
    assert injector.restore_after() == restore_after
    injector.restore_node(nodes)
    assert nodes.calls[-1] == ("restore", action, 1)
    # Inside the trainer a node fault does nothing.
    assert injector.end_step(StepContext(step=5, rank=0, world_size=2)) == []


def test_in_trainer_kinds_do_nothing_to_nodes() -> None:
    nodes = FakeNodes()
    injector = build_injector(parse_fault({"kind": "kill", "at_step": 5}))
    assert injector.on_node(nodes) == [] and injector.restore_after() is None
    assert nodes.calls == []


def test_the_launcher_applies_a_node_fault_at_its_step_even_when_it_saw_steps_pass() -> None:
    """The Docker launcher follows the run from the journal, so steps pass between its looks:
    a fault at step 5 fires at the first look at or past it (by `FaultSpec.fires_at`), once."""
    from harness.running.docker_launch import _Pending

    spec = parse_fault({"kind": "node_kill", "node": 1, "at_step": 5}, "test")
    pending = _Pending(spec, build_injector(spec), node=1)
    assert [pending.due(step, elapsed=0.0) for step in (0, 3, 4)] == [False, False, False]
    assert pending.due(7, elapsed=0.0)  # steps 5 and 6 went by between two looks
    assert not pending.due(9, elapsed=0.0)  # its step is behind it now
    timed = parse_fault({"kind": "node_pause", "node": 0, "after_seconds": 2.5}, "test")
    waiting = _Pending(timed, build_injector(timed), node=0)
    assert not waiting.due(100, elapsed=2.0) and waiting.due(100, elapsed=2.5)
