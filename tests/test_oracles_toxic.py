"""max_toxic_consumed: counts the toxic documents the step events say were trained on, on
every rank and attempt; fails above its bound (the negative control); not judged without
evidence."""

from __future__ import annotations

from pathlib import Path

from harness.oracles import ORACLES, ToxicOracle, judge
from harness.suites.scenario import Expect

from .oracle_runs import TARGET, Run, clean_run


def test_no_toxic_document_consumed_passes(tmp_path: Path) -> None:
    evidence = clean_run(tmp_path, docs=4, contaminated_kinds={"near": 1}).evidence()
    check = ToxicOracle(bound=0).judge(evidence)
    assert check.passed and check.figure == 0 and check.figures["docs"] == 4 * TARGET


def test_toxic_documents_count_on_every_rank_and_redone_step(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).steps(1, 9, docs=4, contaminated_kinds={})
    run.steps(10, 12, docs=4, contaminated_kinds={"toxic": 1, "exact": 2})  # 2 ranks x 3
    run.rollback(12, to=10).steps(11, TARGET, docs=4, contaminated_kinds={}).end()
    evidence = run.evidence()
    assert ToxicOracle(bound=6).judge(evidence).passed
    negative = ToxicOracle(bound=5).judge(evidence)
    assert not negative.passed and (negative.figure, negative.unit) == (6, "docs")
    assert negative.expected == "<= 5 docs"


def test_not_judged_when_no_step_reports_contaminated_kinds(tmp_path: Path) -> None:
    check = ToxicOracle(bound=0).judge(clean_run(tmp_path, contaminated_docs=0).evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "no step reports contaminated_kinds" in check.detail


def test_the_expect_key_builds_the_oracle(tmp_path: Path) -> None:
    assert ORACLES["max_toxic_consumed"] is ToxicOracle
    run = clean_run(tmp_path, docs=4, contaminated_kinds={"toxic": 1})
    (check,) = judge(Expect(max_toxic_consumed=3), run.evidence())
    assert check.name == "max_toxic_consumed" and not check.passed and check.figure == TARGET
