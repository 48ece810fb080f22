"""Crashing, wedged and out-of-memory ranks in trainers written elsewhere, through the
zero-code attach (`tests/trainers/crashes.yaml`): the fault acts inside a trainer that
knows nothing of tightrope, and the verdicts follow what the process did. A one-process
loop that raises, segfaults, aborts or runs out of memory is a crash the harness sees by
its exit (status and signal), never a pass; the GIL held in it is a stall the harness
times; a torchrun job whose rank 1 segfaults is restarted and counted on from its
snapshot. Each fault's own event names the rank it hit."""

from __future__ import annotations

import os
import signal
from itertools import pairwise
from pathlib import Path

import pytest

from harness.records.events import FaultInjected, RunEnd, StepObserved
from harness.records.journal import read_journal
from harness.running.baseline import baseline_key, code_version
from harness.running.results import ScenarioResult, SuiteResult
from harness.running.runner import RunOptions, run_suite
from harness.suites.suite_loader import load_suite

from .conftest import SHARED_CACHE

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "trainers" / "crashes.yaml"

P, F = "passed", "failed"
#: scenario -> (exit code, what the run's error says, check -> (status, figure or None)).
TABLE: dict[str, tuple[int, str | None, dict[str, tuple[str, object]]]] = {
    # The exception reaches the loop from the worker thread and ends the process: exit 1.
    "tutorial-exception-worker": (
        1,
        "OSError: Caught OSError in thread tightrope-data-worker",
        {"completed": (F, 7), "detected": (F, None)},
    ),
    # Killed by the kernel's signal after step 8: the harness reads it from the exit.
    "tutorial-segfault": (
        -signal.SIGSEGV,
        f"exit code {-signal.SIGSEGV}, killed by SIGSEGV",
        {"completed": (F, 8), "detected": (F, None)},
    ),
    "tutorial-abort": (
        -signal.SIGABRT,
        f"exit code {-signal.SIGABRT}, killed by SIGABRT",
        {"completed": (F, 8), "detected": (F, None)},
    ),
    "tutorial-oom": (
        1,
        "MemoryError: [enforce fail",
        {"completed": (F, 7), "detected": (F, None)},
    ),
    # No watchdog: the loop waits the 3 s out and finishes; the stall is measured.
    "tutorial-gil-lock": (0, None, {"completed": (P, 30), "max_stall_seconds": (F, None)}),
    # torchrun restarts the job; it resumes from its last snapshot and finishes.
    "snapshot-segfault": (
        0,
        None,
        {"detected": (P, None), "completed": (P, 40), "max_lost_steps": (P, None)},
    ),
}
ONE_PROCESS = {s.name for s in load_suite(SUITE).scenarios if s.trainer.world_size == 1}


def test_the_table_holds_every_scenario_of_the_suite() -> None:
    assert {s.name for s in load_suite(SUITE).scenarios} == TABLE.keys()


def test_its_fault_free_runs_are_those_of_the_verdicts_suite() -> None:
    """Each trainer configuration here is one of tests/trainers/verdicts.yaml's, so the
    session's shared cache runs its fault-free baseline once for both suites."""
    verdicts = load_suite(ROOT / "tests" / "trainers" / "verdicts.yaml")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)  # the key hashes the scripts the commands name
        code = code_version()  # hashed once, not once a scenario
        ours = {baseline_key(s.trainer, code) for s in load_suite(SUITE).scenarios}
        theirs = {baseline_key(s.trainer, code) for s in verdicts.scenarios}
    assert ours <= theirs


def run_part(out_dir: Path, names: set[str]) -> SuiteResult:
    """The suite's scenarios ``names``, run into ``out_dir``; baselines from the session's
    shared cache (the verdicts suite's fault-free runs are the same configurations)."""
    options = RunOptions(out_dir=out_dir / "out", cache_dir=Path(os.environ[SHARED_CACHE]), cores=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)  # the suite names its trainers relative to the repository
        return run_suite(load_suite(SUITE), options, select=sorted(names), progress=False)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("foreign-crashes")


@pytest.fixture(scope="module")
def one_process(out_dir: Path) -> SuiteResult:
    return run_part(out_dir / "one", ONE_PROCESS)


@pytest.fixture(scope="module")
def two_ranks(out_dir: Path) -> SuiteResult:
    return run_part(out_dir / "two", TABLE.keys() - ONE_PROCESS)


def check(verdicts: SuiteResult, out_dir: Path) -> None:
    for result in verdicts.scenarios:
        code, error, checks = TABLE[result.name]
        assert result.exit_code == code, (result.name, result.error)
        assert (result.error is None) == (error is None), (result.name, result.error)
        if error is not None:
            assert result.error is not None and error in result.error, result.error
        measured = {c.name: (c.status, c.figure) for c in result.checks}
        expected = {
            name: (status, measured.get(name, (None, None))[1] if figure is None else figure)
            for name, (status, figure) in checks.items()
        }
        assert measured == expected, result.name
        fault_rank(result, out_dir)


def fault_rank(result: ScenarioResult, out_dir: Path) -> None:
    """The fault's event names the rank it hit, and that rank's attempt ended with it."""
    journal = read_journal(out_dir / result.run_dir, warn=False)
    (fault,) = [e for e in journal if e.is_(FaultInjected)]
    assert fault["details"]["rank"] == fault.rank
    if result.name == "tutorial-gil-lock":
        # The loop stalled for the lock's 3 s in the faulted step, and in no other.
        steps = [e for e in journal if e.is_(StepObserved)]
        waits = {b.step: b.wall - a.wall for a, b in pairwise(steps)}
        assert waits.pop(fault.step) >= 3.0 and max(waits.values()) < 1.5, waits
        return
    # Nothing of the process ran after the fault: no step past it in that attempt, and no
    # run_end (a signal) or a failed one (an exception).
    attempt = [e for e in journal if e.rank == fault.rank and e.restart == fault.restart]
    assert max(e.step for e in attempt) == fault.step
    ends = [e["status"] for e in attempt if e.is_(RunEnd)]
    assert ends in ([], ["failed"])


@pytest.mark.slow
def test_crashes_of_a_one_process_trainer_are_seen_by_their_exit(
    one_process: SuiteResult, out_dir: Path
) -> None:
    check(one_process, out_dir / "one" / "out")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_torchrun_job_restarts_past_a_segfaulted_rank(
    two_ranks: SuiteResult, out_dir: Path
) -> None:
    check(two_ranks, out_dir / "two" / "out")
