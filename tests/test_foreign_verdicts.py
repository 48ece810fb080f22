"""Verdicts on trainers written elsewhere: the table of what each check must say.

`tests/trainers/` holds trainers written the way people write them (a tutorial loop, a
``GradScaler`` loop, a manual SGD update, a torchrun DDP script with snapshots), none of
which knows tightrope; `tests/trainers/verdicts.yaml` runs each, guarded and unguarded,
under the faults that matter to it, through the zero-code attach. Each guarded trainer must
pass and each unguarded one must fail exactly the checks its missing guard covers, with
the lost work counted exactly.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.records.events import StepObserved
from harness.records.journal import Journal, read_journal
from harness.running.results import SuiteResult
from harness.running.runner import RunOptions, run_suite
from harness.suites.suite_loader import load_suite

from .conftest import SHARED_CACHE

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "trainers" / "verdicts.yaml"

P, F = "passed", "failed"
#: scenario -> check -> (status, figure); None: any figure.
#: nan: detected, params_finite, max_lost_steps, completed.
#: snapshot: detected, completed, max_lost_steps, no_corrupt_checkpoint_loaded (and for the
#: fail-slow and collective kinds, culprit_named, max_slowdown and max_stall_seconds).
TABLE: dict[str, dict[str, tuple[str, object]]] = {
    # No guard: the NaN update goes through; nothing the trainer did shows it noticed.
    "tutorial-nan": {
        "detected": (F, None),
        "params_finite": (F, None),
        "max_lost_steps": (P, 0),
        "completed": (P, 30),
    },
    # The guard skips the faulted step (observed: no optimizer.step, the gradients cleared).
    "tutorial-guard-nan": {
        "detected": (P, 0),
        "params_finite": (P, 0),
        "max_lost_steps": (P, 1),
        "completed": (P, 30),
    },
    # clip_grad_norm_(error_if_nonfinite=True) raises on the NaN, which it can only do
    # because the NaN is there before clipping.
    "tutorial-clip-strict-nan": {
        "detected": (P, 0),
        "params_finite": (P, 0),
        "max_lost_steps": (P, 1),
        "completed": (P, 30),
    },
    # GradScaler sees the inf during unscale_ and skips optimizer.step.
    "amp-inf": {
        "detected": (P, 0),
        "params_finite": (P, 0),
        "max_lost_steps": (P, 1),
        "completed": (P, 30),
    },
    "amp-no-scaler-inf": {
        "detected": (F, None),
        "params_finite": (F, None),
        "max_lost_steps": (P, 0),
        "completed": (P, 30),
    },
    # No torch.optim: steps are still counted, updates seen as parameters changing.
    "manual-nan": {
        "detected": (F, None),
        "params_finite": (F, None),
        "max_lost_steps": (P, 0),
        "completed": (P, 30),
    },
    "manual-guard-nan": {
        "detected": (P, 0),
        "params_finite": (P, 0),
        "max_lost_steps": (P, 1),
        "completed": (P, 30),
    },
    # torchrun restarts the job; it resumes from the snapshot of step 16: steps 17-18 redone.
    "snapshot-kill": {
        "detected": (P, None),
        "completed": (P, 40),
        "max_lost_steps": (P, 2),
        "no_corrupt_checkpoint_loaded": (P, 0),
    },
    # The snapshot of step 16 is damaged on disk; the unguarded trainer loads it on both
    # ranks (hash at load != hash at save) and trains on.
    # Nothing noticed the damage: the restart answers the kill, not the flip.
    "snapshot-bitflip": {
        "detected": (F, None),
        "completed": (P, 40),
        "max_lost_steps": (P, 2),
        "no_corrupt_checkpoint_loaded": (F, 2),
    },
    # --verify refuses it (its digest) and falls back to the snapshot of step 8: steps 9-18
    # redone, detection observed as an intact older file loaded instead.
    "snapshot-verify-bitflip": {
        "detected": (P, None),
        "completed": (P, 40),
        "max_lost_steps": (P, 10),
        "no_corrupt_checkpoint_loaded": (P, 0),
    },
    # Rank 1 computes 4x as long in steps 5-14, its collectives start 100 ms late in
    # steps 17-26, and it enters none for 4 s at step 30: the whole job runs at its pace
    # and stalls with it (measured once on a loaded machine, each kind alone from step 5:
    # 6.8x slower with the straggler, 2.9x with the slow link, a 4.16 s stall with the
    # hang), finishes, and nothing it did shows it noticed; the trainer names nobody.
    "snapshot-fail-slow": {
        "detected": (F, None),
        "completed": (P, 40),
        "max_slowdown": (F, None),
        "max_stall_seconds": (F, None),
        "culprit_named": (F, 0),
    },
    # Rank 1's all-reduce raises during step 18: the worker exits non-zero before the
    # step ends, torchrun restarts the job from the snapshot of step 16: step 17 redone
    # (a kill at 18 comes after the step, so it loses 17 and 18); nobody is named.
    "snapshot-collective-fail": {
        "detected": (P, None),
        "completed": (P, 40),
        "max_lost_steps": (P, 1),
        "no_corrupt_checkpoint_loaded": (P, 0),
        "culprit_named": (F, 0),
    },
}


#: The scenarios of trainers that run as one process; the others start two ranks under
#: torchrun, one at a time in the serial lane of tests/lanes.py.
ONE_PROCESS = {s.name for s in load_suite(SUITE).scenarios if s.trainer.world_size == 1}


def test_the_table_holds_every_scenario_of_the_suite() -> None:
    assert {s.name for s in load_suite(SUITE).scenarios} == TABLE.keys()
    assert ONE_PROCESS and ONE_PROCESS < TABLE.keys()


def run_part(out_dir: Path, names: set[str]) -> SuiteResult:
    """The suite's scenarios ``names``, run into ``out_dir``; baselines from the session's
    shared cache (tests/trainers/crashes.yaml runs the same configurations)."""
    options = RunOptions(out_dir=out_dir / "out", cache_dir=Path(os.environ[SHARED_CACHE]), cores=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)  # the suite names its trainers relative to the repository
        return run_suite(load_suite(SUITE), options, select=sorted(names), progress=False)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> SuiteResult:
    return run_part(tmp_path_factory.mktemp("foreign"), ONE_PROCESS)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("foreign")


@pytest.fixture(scope="module")
def two_ranks(out_dir: Path) -> SuiteResult:
    return run_part(out_dir, TABLE.keys() - ONE_PROCESS)


def check_verdicts(verdicts: SuiteResult, names: set[str]) -> None:
    """Every verdict of the scenarios ``names`` is the table's."""
    measured = {
        r.name: {c.name: (c.status, c.figure) for c in r.checks} for r in verdicts.scenarios
    }
    errors = {r.name: r.error for r in verdicts.scenarios if r.error}
    assert not errors, errors
    expected = {
        name: {check: (status, measured.get(name, {}).get(check, (None, None))[1])
               if figure is None else (status, figure)
               for check, (status, figure) in TABLE[name].items()}
        for name in names
    }  # fmt: skip
    assert measured == expected


def detectors(verdicts: SuiteResult) -> dict[str, object]:
    """The detector each passed detection names, by scenario."""
    return {
        r.name: c.figures.get("detector")
        for r in verdicts.scenarios
        for c in r.checks
        if c.name == "detected" and c.passed
    }


@pytest.mark.slow
def test_every_verdict_on_one_process_foreign_trainers_follows_what_they_did(
    one_process: SuiteResult,
) -> None:
    check_verdicts(one_process, ONE_PROCESS)


@pytest.mark.slow
@pytest.mark.distributed
def test_every_verdict_on_foreign_torchrun_jobs_follows_what_they_did(
    two_ranks: SuiteResult,
) -> None:
    check_verdicts(two_ranks, TABLE.keys() - ONE_PROCESS)


@pytest.mark.slow
def test_detection_names_what_the_one_process_trainer_did(one_process: SuiteResult) -> None:
    assert detectors(one_process) == {
        "tutorial-guard-nan": "skipped_step",
        "tutorial-clip-strict-nan": "skipped_step",
        "amp-inf": "skipped_step",
        "manual-guard-nan": "skipped_step",
    }


@pytest.mark.slow
@pytest.mark.distributed
def test_detection_names_what_the_torchrun_job_did(two_ranks: SuiteResult) -> None:
    assert detectors(two_ranks) == {
        "snapshot-kill": "restart",
        "snapshot-verify-bitflip": "checkpoint_integrity",
        "snapshot-collective-fail": "restart",
    }


def intervals(journal: Journal, steps: range) -> list[float]:
    """Seconds from rank 0's step ``n - 1`` to its step ``n``, for each ``n`` of ``steps``
    (the first attempt)."""
    wall = {e.step: e.wall for e in journal.of_kind(StepObserved) if e.rank == 0 and not e.restart}
    return [wall[n] - wall[n - 1] for n in steps]


@pytest.mark.slow
@pytest.mark.distributed
def test_each_fail_slow_fault_slows_the_foreign_job_in_its_own_steps(
    two_ranks: SuiteResult, out_dir: Path
) -> None:
    """Read from rank 0's steps, each fault in its phase: rank 0 waits in DDP's all-reduce
    for rank 1, so it cannot finish a step before rank 1 joins. A straggler 4x slow
    (steps 5-14) slows those steps against the clean run's same steps; a collective 100 ms
    late (steps 17-26) costs each step about that; a 4 s hang (step 30) stalls that step
    at least that long."""
    result = next(r for r in two_ranks.scenarios if r.name == "snapshot-fail-slow")
    faulted = read_journal(out_dir / "out" / result.run_dir, warn=False)
    assert result.baseline_dir
    clean = read_journal(out_dir / "out" / result.baseline_dir, warn=False)  # its kept copy
    straggling, clean_pace = intervals(faulted, range(6, 15)), intervals(clean, range(6, 15))
    assert sum(straggling) > 1.5 * sum(clean_pace), (straggling, clean_pace)
    late = intervals(faulted, range(18, 27))
    assert sum(late) / len(late) >= 0.09, late
    [hung] = intervals(faulted, range(30, 31))
    assert hung >= 3.9
    stall = next(c for c in result.checks if c.name == "max_stall_seconds")
    assert stall.figure is not None and float(stall.figure) >= 3.9, stall.detail


@pytest.mark.slow
@pytest.mark.distributed
def test_a_restarted_job_counts_on_from_its_snapshot(two_ranks: SuiteResult, out_dir: Path) -> None:
    result = next(r for r in two_ranks.scenarios if r.name == "snapshot-verify-bitflip")
    journal = read_journal(out_dir / "out" / result.run_dir)
    restarted = [e for e in journal if e.kind == "step" and e.rank == 0 and e.restart == 1]
    assert restarted and restarted[0].step == 9  # the fallback snapshot was saved at step 8
    [refused] = [e for e in journal.of_kind("file_loaded") if e.rank == 0 and e.restart == 1]
    assert refused["path"].endswith("snapshot.pt.prev") and refused["intact"] is True
