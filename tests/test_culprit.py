"""The checks of a slow or broken rank: ``culprit_named`` (the rank a fault hit is the rank
named, judged against the fault's own record) and ``max_slowdown`` (rank 0's pace against
the baseline's), each with a pass, a fail and a "not judged", on journals made here; and
the `detected` corroboration a right naming gives a claim."""

from __future__ import annotations

import json
from pathlib import Path

from harness.oracles import CulpritOracle, DetectedOracle, SlowdownOracle
from harness.oracles.detection import DetectedExpect
from harness.run_layout import RunLayout

from .oracle_runs import TARGET, Run, clean_run


def straggler_run(run_dir: Path, *, blamed: int | None, hit: int = 1) -> Run:
    """Two ranks; a straggler on rank ``hit`` from step 5; rank 0 names ``blamed``."""
    run = Run(run_dir, world_size=2).steps(1, 4)
    run.emit("fault_injected", 5, rank=hit, fault="straggler", target=f"rank {hit}",
             details={"rank": hit, "factor": 3.0})  # fmt: skip
    run.steps(5, 7)
    if blamed is not None:
        run.emit("detected", 7, detector="straggler", details={"rank": blamed})
        run.emit("rank_blamed", 7, blamed_rank=blamed, detector="straggler", reason="slow")
    return run.steps(8, TARGET).end()


def test_the_rank_hit_named_passes(tmp_path: Path) -> None:
    check = CulpritOracle().judge(straggler_run(tmp_path, blamed=1).evidence())
    assert check.passed and check.figure == 1
    assert "rank 1 named by straggler at step 7" in check.detail


def test_another_rank_named_fails(tmp_path: Path) -> None:
    check = CulpritOracle().judge(straggler_run(tmp_path, blamed=0).evidence())
    assert not check.passed and check.status == "failed"
    assert "rank 0 named by straggler, but the fault hit rank 1" in check.detail


def test_nobody_named_while_the_run_had_the_fault_fails(tmp_path: Path) -> None:
    check = CulpritOracle().judge(straggler_run(tmp_path, blamed=None).evidence())
    assert not check.passed and check.status == "failed"
    assert "no rank was named" in check.detail


def test_a_naming_before_the_fault_does_not_count(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).steps(1, 2)
    run.emit("rank_blamed", 2, blamed_rank=1, detector="straggler")
    run.steps(3, 4).emit("fault_injected", 5, rank=1, fault="straggler", target="rank 1",
                         details={"rank": 1})  # fmt: skip
    check = CulpritOracle().judge(run.steps(5, TARGET).end().evidence())
    assert not check.passed and "no rank was named" in check.detail


def test_culprit_not_judged_without_a_fault(tmp_path: Path) -> None:
    check = CulpritOracle().judge(clean_run(tmp_path).evidence())
    assert check.status == "not judged" and not check.passed


def test_the_rank_hit_is_the_journaling_rank_when_the_record_names_none(tmp_path: Path) -> None:
    run = Run(tmp_path, world_size=2).steps(1, 4)
    run.emit("fault_injected", 5, rank=1, fault="collective_fail", target="rank 1")
    run.emit("rank_blamed", 5, rank=0, blamed_rank=1, detector="collective_watchdog")
    assert CulpritOracle().judge(run.steps(5, TARGET).end().evidence()).passed


# -- detected: a claim that names the rank hit is backed by that naming --------------------


def test_a_straggler_claim_naming_the_rank_hit_counts_as_detected(tmp_path: Path) -> None:
    oracle = DetectedOracle.from_expect(DetectedExpect(detector="straggler", within_steps=2))
    check = oracle.judge(straggler_run(tmp_path, blamed=1).evidence())
    assert check.passed and check.figure == 2


def test_a_straggler_claim_naming_another_rank_is_only_a_word(tmp_path: Path) -> None:
    oracle = DetectedOracle.from_expect(DetectedExpect(detector="straggler"))
    check = oracle.judge(straggler_run(tmp_path, blamed=0).evidence())
    assert not check.passed and "claimed straggler" in check.detail


# -- max_slowdown -------------------------------------------------------------------------


def paced_run(run_dir: Path, seconds_per_step: float, steps: int = 10) -> Run:
    """Rank 0's steps ``seconds_per_step`` apart: the journal's lines are rewritten with
    those wall times (a writer stamps its own clock; nothing is waited for)."""
    run = Run(run_dir).steps(1, steps).end()
    run.close()
    path = RunLayout(run_dir).journal_file(0)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        line["wall"] = 1_000_000.0 + line["step"] * seconds_per_step
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def test_slowdown_against_the_baseline(tmp_path: Path) -> None:
    base = paced_run(tmp_path / "base", 0.5)
    evidence = paced_run(tmp_path / "run", 1.5).evidence(baseline=base)
    check = SlowdownOracle(bound=4).judge(evidence)
    assert check.passed and check.figure == 3.0
    failed = SlowdownOracle(bound=2).judge(evidence)
    assert not failed.passed and failed.status == "failed" and failed.expected == "<= 2x"


def test_slowdown_not_judged_without_a_baseline_or_steps(tmp_path: Path) -> None:
    check = SlowdownOracle(bound=2).judge(paced_run(tmp_path / "run", 1.0).evidence())
    assert check.status == "not judged"
    one = Run(tmp_path / "one").step(1).end().evidence(baseline=paced_run(tmp_path / "b", 1.0))
    assert SlowdownOracle(bound=2).judge(one).status == "not judged"
