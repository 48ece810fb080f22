"""max_fallback_rate: judged from the byte-fallback tokens the trainer counted in each batch
that reached the model; with a run that passes, its negative control, and no evidence."""

from __future__ import annotations

from pathlib import Path

from harness.oracles import ORACLES, FallbackRateOracle, build_oracles
from harness.suites.scenario import Expect

from .oracle_runs import TARGET, Run, clean_run


def test_no_fallback_tokens_passes(tmp_path: Path) -> None:
    evidence = clean_run(tmp_path, fallback_tokens=0, batch_tokens=520).evidence()
    check = FallbackRateOracle(bound=0.005).judge(evidence)
    assert check.passed and check.figure == 0 and check.figures["tokens"] == 520 * TARGET


def test_fallback_counts_every_rank_and_redone_step(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).steps(1, 9, fallback_tokens=0, batch_tokens=100)
    run.steps(10, 12, fallback_tokens=10, batch_tokens=100)  # 2 ranks x 3 steps
    run.rollback(12, to=10).steps(11, TARGET, fallback_tokens=0, batch_tokens=100).end()
    check = FallbackRateOracle(bound=0.005).judge(run.evidence())
    tokens = 100 * 2 * (TARGET + 2)  # steps 11 and 12 ran twice
    assert not check.passed and check.figure == 60 / tokens and check.unit == "share"
    assert "60 byte-fallback tokens" in check.detail


def test_not_judged_without_the_counts(tmp_path: Path) -> None:
    check = FallbackRateOracle(bound=0.005).judge(clean_run(tmp_path).evidence())
    assert check.status == "not judged" and not check.passed and check.figure is None
    assert "never observed" in check.detail


def test_the_expect_key_builds_the_oracle() -> None:
    assert ORACLES["max_fallback_rate"] is FallbackRateOracle
    (oracle,) = build_oracles(Expect(max_fallback_rate=0.01))
    assert oracle == FallbackRateOracle(bound=0.01)
