"""Suite files: valid ones load with defaults merged; bad ones are refused, each problem
named with its file, line and dotted path, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults import FaultPlan, FaultSpecError
from harness.suites.keywords import KeywordError, keyword_match
from harness.suites.scenario import Expect, TrainerSpec
from harness.suites.scenario_schema import suite_schema
from harness.suites.suite_loader import ScenarioError, load_suite, parse_suite

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        load_suite(write(tmp_path, text))
    return caught.value.problems


GOOD = """\
suite: demo
defaults:
  trainer: {steps: 30, world_size: 2}
  expect: {completed: true, params_finite: true}
  weight: 3
scenarios:
  - name: nan
    faults: [{kind: nan_grad, at_step: 10, ranks: [1]}]
    expect: {detected: {within_steps: 0}, params_finite: null}
  - name: spike
    class: loss_spike
    trainer: {steps: 20}
    faults: [{kind: lr_spike, at_step: 5}]
    expect: {final_loss_within: 0.1}
    weight: 1
"""


def test_defaults_merge_under_each_scenarios_own_keys(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path, GOOD))
    nan, spike = suite.scenarios
    assert suite.name == "demo"
    assert (nan.trainer.steps, nan.trainer.world_size, nan.weight) == (30, 2, 3)
    assert nan.expect.checks() == ["detected", "completed"]  # params_finite: null dropped it
    assert nan.scored_class == "numeric"
    assert (spike.trainer.steps, spike.trainer.world_size, spike.weight) == (20, 2, 1)
    assert spike.scored_class == "loss_spike"
    assert spike.expect.checks() == ["params_finite", "completed", "final_loss_within"]
    assert spike.expect.needs_baseline() and not nan.expect.needs_baseline()


def test_every_problem_is_reported_with_its_line_and_dotted_path(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """\
suite: bad
defaults:
  trainer: {steps: 30}
  expect: {completed: true}
scenarios:
  - name: one
    faults:
      - kind: nan_grad
        at_step: 5
        fraction: 2
  - name: two
    trainer: {stepz: 3, precision: fp8}
    expect:
      detectd: true
      max_lost_steps: -1
  - name: three
    faults: [{kind: nosuch, at_step: 1}]
""",
    )
    path = tmp_path / "suite.yaml"
    assert found == [
        f"{path}:10: scenarios[0].faults[0].fraction: Input should be less than or equal to 1 "
        "(got 2)",
        f"{path}:12: scenarios[1].trainer.precision: Input should be 'fp32', 'bf16' or 'fp16' "
        "(got 'fp8')",
        f"{path}:12: scenarios[1].trainer.stepz: unknown trainer field 'stepz'; expected one of "
        f"{', '.join(TrainerSpec.model_fields)}",
        f"{path}:15: scenarios[1].expect.max_lost_steps: Input should be greater than or equal "
        "to 0 (got -1)",
        f"{path}:14: scenarios[1].expect.detectd: unknown check 'detectd'; expected one of "
        f"{', '.join(Expect.model_fields)}",
        f"{path}:17: scenarios[2].faults[0].kind: unknown fault kind 'nosuch'; see "
        "`tightrope faults`",
    ]


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        (
            "{name: a, trainer: {steps: 20}, faults: [{kind: nan_grad, at_step: 30}], "
            "expect: {completed: true}}",
            "scenarios[0]: faults[0] (nan_grad) fires at step 30, past trainer.steps 20",
        ),
        (
            "{name: a, faults: [{kind: nan_grad, at_step: 3, ranks: [2]}], "
            "expect: {completed: true}}",
            "targets ranks [2], but trainer.world_size is 1",
        ),
        (
            "{name: a, trainer: {steps: 20}, expect: {max_lost_steps: 50}}",
            "expect.max_lost_steps 50 is past trainer.steps 20; it cannot bind",
        ),
        (
            "{name: a, expect: {final_loss_within: 0}}",
            "scenarios[0].expect.final_loss_within: Input should be greater than 0",
        ),
        ("{name: a, expect: {detected: true}}", "expect.detected needs a fault to detect"),
        ("{name: a, expect: {completed: false}}", "expect asks for no check"),
        ("{name: a, expect: {mttr: {}}}", "give max_steps, max_seconds or both"),
        (
            "{name: a, trainer: {steps: 20, checkpoint_every: 50}, expect: {completed: true}}",
            "checkpoint_every 50 is past steps 20",
        ),
        (
            "{name: a, trainer: {disable: [seatbelts]}, expect: {completed: true}}",
            "unknown mechanism(s) seatbelts",
        ),
        (
            "{name: a, trainer: {command: 'python t.py', resume_after: 3}, "
            "expect: {completed: true}}",
            "disable, enable, resume_after and stop_after apply to the reference trainer",
        ),
        ("{name: 'bad name!', expect: {completed: true}}", "scenarios[0].name: String should"),
        (
            "{name: a, trainer: {launcher: docker, nodes: 2, world_size: 2}, "
            "faults: [{kind: node_kill, at_step: 3, node: 2}], expect: {completed: true}}",
            "targets node 2, but the trainer has nodes 0..1",
        ),
        (
            "{name: a, faults: [{kind: node_pause, at_step: 3, node: 0}], "
            "expect: {completed: true}}",
            "node faults need launcher: docker",
        ),
        (
            "{name: a, trainer: {launcher: docker, nodes: 2, world_size: 3}, "
            "expect: {completed: true}}",
            "world_size 3 does not split over 2 nodes",
        ),
        ("{name: a, trainer: {nodes: 2}, expect: {completed: true}}", "need launcher: docker"),
    ],
)
def test_impossible_scenarios_are_refused(tmp_path: Path, scenario: str, expected: str) -> None:
    (problem,) = problems(tmp_path, f"scenarios:\n  - {scenario}\n")
    assert expected in problem and problem.startswith(f"{tmp_path / 'suite.yaml'}:2: ")


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    (problem,) = problems(tmp_path, "scenarios:\n  - name: a\n    expect: {completed: true\n")
    assert problem.startswith(f"{tmp_path / 'suite.yaml'}:4: not valid YAML")


def test_files_that_are_not_suites_are_refused(tmp_path: Path) -> None:
    assert "a suite is a mapping" in problems(tmp_path, "- 1\n- 2\n")[0]
    assert "expected a non-empty list of scenarios" in problems(tmp_path, "suite: x\n")[0]
    found = problems(tmp_path, "sweet: x\nscenarios: [{name: a, expect: {completed: true}}]\n")
    assert found == [f"{tmp_path / 'suite.yaml'}:1: sweet: unknown key; a suite has "
                     "defaults, description, scenarios, suite"]  # fmt: skip
    dup = "scenarios: [{name: a, expect: {completed: true}}, {name: a, expect: {completed: true}}]"
    assert "two scenarios are named 'a'" in problems(tmp_path, dup)[0]
    with pytest.raises(ScenarioError, match="cannot read suite"):
        load_suite(tmp_path / "missing.yaml")


def test_untrusted_yaml_tags_are_not_constructed(tmp_path: Path) -> None:
    text = "scenarios: !!python/object/apply:os.system ['touch pwned']\n"
    (problem,) = problems(tmp_path, text)
    assert "not valid YAML" in problem and not Path("pwned").exists()


def test_a_scenario_round_trips_through_its_saved_spec() -> None:
    suite = parse_suite(
        {
            "scenarios": [
                {
                    "name": "a",
                    "class": "data",
                    "faults": [{"kind": "nan_grad", "at_step": 3, "target": "blocks.*"}],
                    "expect": {"mttr": {"max_steps": 4}},
                }
            ]
        },
        "<test>",
    )
    (scenario,) = suite.scenarios
    saved = json.loads(json.dumps(scenario.model_dump(mode="json", by_alias=True)))
    again = type(scenario).model_validate(saved)
    assert again == scenario and again.plan() == {
        "faults": [{"kind": "nan_grad", "at_step": 3, "target": "blocks.*"}]
    }


def test_the_shipped_suites_are_valid() -> None:
    for name in ("smoke", "core"):
        suite = load_suite(ROOT / "scenarios" / f"{name}.yaml")
        classes = {s.scored_class for s in suite.scenarios}
        assert {"numeric", "loss_spike", "checkpoint", "data"} <= classes


def test_the_schema_describes_every_fault_kind_and_check() -> None:
    schema = suite_schema()
    scenario = schema["$defs"]["Scenario"]
    kinds = scenario["properties"]["faults"]["items"]["discriminator"]["mapping"]
    assert {"nan_grad", "truncate", "kill", "duplicate_contamination"} <= set(kinds)
    assert "max_lost_steps" in schema["$defs"]["Expect"]["properties"]
    assert scenario["required"] == ["name"]
    json.dumps(schema)  # plain JSON


@pytest.mark.parametrize(
    ("expr", "words", "expected"),
    [
        ("nan", ["nan-grad", "numeric", "nan_grad"], True),
        ("NAN and not rank1", ["nan-grad-rank1", "numeric"], False),
        ("checkpoint or data", ["dup", "data"], True),
        ("(spike or nan) and not fp16", ["fp16-overflow", "numeric"], False),
    ],
)
def test_keyword_expressions_select_like_pytest(
    expr: str, words: list[str], expected: bool
) -> None:
    assert keyword_match(expr, words) is expected


@pytest.mark.parametrize("expr", ["", "nan and", "__import__('os')"])
def test_bad_keyword_expressions_are_refused(expr: str) -> None:
    with pytest.raises(KeywordError):
        keyword_match(expr, ["nan"])


BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def test_an_alias_bomb_is_refused_before_anything_expands_it(tmp_path: Path) -> None:
    import time

    suite = tmp_path / "bomb.yaml"
    suite.write_text(BOMB + "scenarios: [*i]\n")
    started = time.monotonic()
    with pytest.raises(ScenarioError, match="once its aliases are expanded; refused"):
        load_suite(suite)
    plan = tmp_path / "plan.yaml"
    plan.write_text(BOMB + "faults: [*i]\n")
    with pytest.raises(FaultSpecError, match="once its aliases are expanded; refused"):
        FaultPlan.from_yaml(plan)
    assert time.monotonic() - started < 5


def test_oversized_and_non_utf8_files_are_refused_by_name(tmp_path: Path) -> None:

    big = tmp_path / "big.yaml"
    big.write_text("faults: []\n" + "#" * (2 << 20))
    with pytest.raises(FaultSpecError, match=r"big.yaml: fault plan of \d+ bytes; at most"):
        FaultPlan.from_yaml(big)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"suite: s\nscenarios: []\n# caf\xe9\n")
    with pytest.raises(ScenarioError, match=r"latin.yaml:3: suite is not UTF-8 text"):
        load_suite(latin)


def test_steps_and_seeds_have_bounds(tmp_path: Path) -> None:

    suite = tmp_path / "huge.yaml"
    suite.write_text(
        "scenarios:\n  - name: a\n    trainer: {steps: 100000000000000000000, seed: -1}\n"
        "    expect: {completed: true}\n"
    )
    with pytest.raises(ScenarioError) as err:
        load_suite(suite)
    assert "trainer.steps" in str(err.value) and "trainer.seed" in str(err.value)


def test_a_huge_or_deep_keyword_expression_is_a_clear_error() -> None:
    with pytest.raises(KeywordError, match="at most 10000"):
        keyword_match("nan or " * 50_000 + "nan", ["nan"])
    with pytest.raises(KeywordError, match="nested more than 100 deep"):
        keyword_match("(" * 500 + "nan" + ")" * 500, ["nan"])
    with pytest.raises(KeywordError, match="nested more than 100 deep"):
        keyword_match("not " * 500 + "nan", ["nan"])
    assert keyword_match("not not (nan or x) and not y", ["nan-grad"])
