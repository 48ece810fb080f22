"""A check is declared once, in its oracle class: the scenario model, its order and the docs'
table of checks are all read from those declarations."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from harness.oracles import ORACLES
from harness.oracles.base import ExpectOracle, registered
from harness.oracles.checks_doc import PAGE, checks_table, main, table_span
from harness.oracles.expectation import Expectation
from harness.oracles.verdict import Check, Evidence
from harness.suites.scenario import Expect
from harness.suites.suite_loader import ScenarioError, parse_suite

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_table_of_checks_is_made_from_the_oracles() -> None:
    page = (ROOT / PAGE).read_text()
    start, end = table_span(page)
    assert page[start:end] == checks_table(), (
        "docs/scenarios.md's table of checks is not the oracles' (python -m "
        "harness.oracles.checks_doc rewrites it)"
    )


def test_the_table_is_rewritten_in_place(tmp_path: Path) -> None:
    page = tmp_path / PAGE
    page.parent.mkdir()
    page.write_text(
        "# Scenarios\n\n| check | passes when | figure |\n|---|---|---|\n| old |\n\nAfter.\n"
    )
    assert main(tmp_path) == 0
    text = page.read_text()
    assert text == f"# Scenarios\n\n{checks_table()}\nAfter.\n"
    assert "| `mttr: {max_steps, max_seconds}` |" in text


def test_expect_has_one_field_per_declared_check_in_their_order() -> None:
    assert list(Expect.model_fields) == list(ORACLES) == list(registered())
    orders = [oracle.expectation.order for oracle in ORACLES.values()]
    assert orders == sorted(orders)


def test_an_unknown_check_is_answered_with_the_checks_in_their_order() -> None:
    """The order scenarios have always listed the checks in (docs/scenarios.md shows it)."""
    data = {"scenarios": [{"name": "a", "expect": {"detectd": True}}]}
    with pytest.raises(ScenarioError) as caught:
        parse_suite(data, "bad.yaml")
    assert caught.value.problems == [
        "bad.yaml: scenarios[0].expect.detectd: unknown check 'detectd'; expected one of "
        "detected, params_finite, completed, final_loss_within, max_lost_steps, mttr, "
        "no_corrupt_checkpoint_loaded, max_contamination_consumed, max_false_alarms, "
        "loss_scale_recovered, max_fallback_rate, max_toxic_consumed, replicas_consistent, "
        "max_phrase_collapse, kept_params_finite, max_stall_seconds, no_processes_left, "
        "culprit_named, max_slowdown"
    ]


def test_a_check_without_an_expectation_is_refused() -> None:
    with pytest.raises(TypeError, match=r"check Unsaid \('unsaid'\) declares no expectation"):

        class Unsaid(ExpectOracle):
            name = "unsaid"

            def judge(self, evidence: Evidence) -> Check:
                raise NotImplementedError


def test_two_checks_in_one_place_are_refused() -> None:
    class Twin(ExpectOracle):
        name = "twin"
        expectation = Expectation(
            type=bool, order=ORACLES["completed"].expectation.order, passes_when="", figure=""
        )

        def judge(self, evidence: Evidence) -> Check:
            raise NotImplementedError

    try:
        with pytest.raises(TypeError, match="CompletedOracle and Twin share a name or an order"):
            registered()
    finally:
        del Twin
        gc.collect()
    assert list(registered()) == list(ORACLES)
