"""Crashing, wedged and out-of-memory ranks against the reference trainer, end to end: one
two-rank job meets all five kinds in turn (an exception in a worker thread, a segfault, an
abort on rank 0, an allocation failure, a thread holding the GIL), and must finish, each
time restarted by torchrun from its newest valid checkpoint, with each cause journaled and
the rank that the fault hit, and only that rank, blamed. The clean run beside it is the
negative control: no cause journaled, nobody blamed, no crash report left.

What the fault hit is read from its own `fault_injected` event (`details.rank`); what was
blamed from `rank_blamed`; the restarts and resumes from the journal and the checkpoints
on disk, never from the trainer's word alone. About 6 minutes on 2 shared, loaded cores (five
restarts of a tiny model; torchrun's restart is most of it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.records.events import (
    CheckpointLoaded,
    Detected,
    FaultInjected,
    RankBlamed,
    Restart,
    StepObserved,
)
from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from harness.running.results import ScenarioResult
from harness.running.runner import RunOptions, run_suite
from harness.suites.suite_loader import parse_suite

# It judges watchdog deadlines and restarts (run one at a time: tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.distributed]

#: (fault, the detector that must name its rank, words the restart after it must say)
PARADE = [
    ({"kind": "rank_exception", "at_step": 5, "ranks": [1], "thread": "worker"},
     "rank_crash", "rank 1 raised RuntimeError at step 5"),
    ({"kind": "segfault", "at_step": 9, "ranks": [1]},
     "rank_crash", "rank 1 died by SIGSEGV after step 9"),
    ({"kind": "abort", "at_step": 13, "ranks": [0]},
     "rank_crash", "rank 0 died by SIGABRT after step 13"),
    ({"kind": "oom", "at_step": 17, "ranks": [1]},
     "out_of_memory", "rank 1 raised MemoryError at step 17"),
    ({"kind": "gil_lock", "at_step": 21, "ranks": [1], "seconds": 60},
     "wedged_rank", ""),
]  # fmt: skip
DETECTORS = {"rank_crash", "out_of_memory", "wedged_rank"}


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("crashes")


@pytest.fixture(scope="module")
def results(out: Path) -> dict[str, ScenarioResult]:
    trainer = {"world_size": 2, "steps": 24, "checkpoint_every": 4, "max_restarts": 6}
    suite = parse_suite(
        {
            "suite": "crashes",
            "scenarios": [
                {
                    "name": "parade",
                    "trainer": trainer | {"timeout": 420, "disable": ["oom_retry"]},
                    "faults": [fault for fault, _, _ in PARADE],
                    "expect": {"completed": True, "no_processes_left": True},
                },
                {
                    "name": "clean",
                    "trainer": trainer | {"timeout": 120},
                    "expect": {"completed": True, "no_processes_left": True},
                },
            ],
        },
        "<test>",
    )
    options = RunOptions(out_dir=out, cache_dir=out / "cache", cores=2)
    return {r.name: r for r in run_suite(suite, options, progress=False).scenarios}


def test_the_job_outlives_every_crash_and_wedge(results: dict[str, ScenarioResult]) -> None:
    result = results["parade"]
    assert result.status == "passed", [(c.name, c.figure, c.detail) for c in result.checks]


def test_each_fault_names_the_rank_it_hit_and_only_that_rank_is_blamed(
    results: dict[str, ScenarioResult], out: Path
) -> None:
    journal = read_journal(out / results["parade"].run_dir, warn=False)
    injected = [e for e in journal if e.is_(FaultInjected)]
    assert [e["fault"] for e in injected] == [f["kind"] for f, _, _ in PARADE]
    blamed = [e for e in journal if e.is_(RankBlamed)]
    for event, (fault, detector, _) in zip(injected, PARADE, strict=True):
        (rank,) = fault["ranks"]
        assert event["details"]["rank"] == rank and event.rank == rank
        # Blamed in the attempt the fault hit, or (a signal: nothing ran after it) by rank
        # 0 at the start of the next one.
        named = {
            e["blamed_rank"]
            for e in blamed
            if e["detector"] == detector and e.restart in (event.restart, event.restart + 1)
            and e.step == event.step - (detector == "wedged_rank")  # (the last step done)
        }  # fmt: skip
        assert named == {rank}, fault
    assert {e["blamed_rank"] for e in blamed} == {0, 1}
    assert {(e["blamed_rank"], e["detector"]) for e in blamed if e["detector"] in DETECTORS} == {
        (f["ranks"][0], d) for f, d, _ in PARADE
    }
    # The collective ledger names a rank too (the survivor's all-reduce failed or hung, and
    # the other never entered it): always the rank the fault hit in that attempt.
    hit = {e.restart: e["details"]["rank"] for e in injected}
    ledger = [e for e in blamed if e["detector"] == "collective_watchdog"]
    assert ledger and all(e["blamed_rank"] == hit[e.restart] for e in ledger)
    assert {e["detector"] for e in blamed} <= DETECTORS | {"collective_watchdog"}


def test_each_restart_says_the_cause_and_resumes_from_a_checkpoint(
    results: dict[str, ScenarioResult], out: Path
) -> None:
    run_dir = out / results["parade"].run_dir
    journal = read_journal(run_dir, warn=False)
    reasons = {e.restart: e["reason"] for e in journal if e.is_(Restart) and e.rank == 0}
    assert sorted(reasons) == [1, 2, 3, 4, 5]
    for attempt, (_, _, words) in enumerate(PARADE, start=1):
        assert words in reasons[attempt], reasons[attempt]
    # Each resume is from a checkpoint before the fault, at most two saves back (the
    # newest may still have been in flight when the rank died).
    loaded = [e for e in journal if e.is_(CheckpointLoaded) and e.rank == 0]
    steps = [int(Path(e["path"]).name.removeprefix("step-")) for e in loaded]
    assert len(steps) == len(PARADE)
    for step, (fault, _, _) in zip(steps, PARADE, strict=True):
        assert fault["at_step"] - 8 < step <= fault["at_step"], steps
    last = max(e.step for e in journal if e.is_(StepObserved) and e.rank == 0)
    assert last == 24
    # The signals' reports are on disk, one per rank that died so.
    reports = RunLayout(run_dir).crashes.iterdir()
    crashes = sorted(p.name for p in reports if p.stat().st_size > 0)
    assert crashes == ["rank-0-restart-2.txt", "rank-1-restart-1.txt"]


def test_a_clean_run_journals_no_cause_and_blames_nobody(
    results: dict[str, ScenarioResult], out: Path
) -> None:
    result = results["clean"]
    assert result.status == "passed"
    run_dir = out / result.run_dir
    journal = read_journal(run_dir, warn=False)
    assert not [e for e in journal if e.is_(RankBlamed) or e.is_(Restart)]
    assert not [e for e in journal if e.is_(Detected) and e["detector"] in DETECTORS]
    assert not list(RunLayout(run_dir).crashes.glob("*"))
