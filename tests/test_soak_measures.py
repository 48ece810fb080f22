"""A soak's measures from journals whose clocks the test sets: ETTR, goodput, time to
recover and each fault's outcome, with the runs that must score worse beside them."""

from __future__ import annotations

from typing import Any

import pytest

from harness.records.journal import Event, Journal
from harness.soak.measures import executions, measure


class Clock:
    """Writes rank-0 events one after another, ``gap`` seconds apart unless told."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.wall = 1000.0
        self.restart = 0

    def at(self, kind: str, step: int, after: float = 1.0, rank: int = 0, **fields: Any) -> Clock:
        self.wall += after
        self.events.append(Event(kind, step, rank, self.restart, self.wall, self.wall, fields))
        return self

    def start(self, after: float = 1.0) -> Clock:
        return self.at("run_start", 0, after, world_size=1, pid=1, host="h")

    def steps(self, first: int, last: int, **fields: Any) -> Clock:
        for s in range(first, last + 1):
            self.at("step", s, loss=3.0, tokens=100, **fields)
        return self

    def journal(self) -> Journal:
        return Journal(sorted(self.events, key=lambda e: e.wall))


def test_a_clean_run_keeps_every_step_and_counts_only_training_time() -> None:
    run = Clock().start().steps(1, 10)
    run.at("checkpoint_saved", 10, after=5.0, path="c")  # 5 s of saving: not training
    run.steps(11, 20)
    m = measure(run.journal(), wall_seconds=40.0)
    assert (m.kept_steps, m.executed_steps, m.steps_lost) == (20, 20, 0)
    assert m.kept_seconds == pytest.approx(20.0)  # one second a step, the save left out
    assert m.ettr == pytest.approx(0.5)
    assert m.goodput == pytest.approx(20 * 100 / 40)
    assert m.goodput_unit == "tokens/s"


def test_steps_redone_after_a_restart_are_lost_and_the_restart_costs_ettr() -> None:
    clean = Clock().start().steps(1, 10)
    run = Clock().start().steps(1, 6)
    run.at("fault_injected", 6, after=0.1, fault="kill", details={"plan_index": 0})
    fault_wall = run.wall
    run.restart = 1
    run.start(after=8.0).at("checkpoint_loaded", 5, after=2.0, path="c")
    run.at("restart", 5, after=0.0)
    run.steps(6, 10)
    # The launch lasts from the first clock tick to the last event, as the harness times it.
    m = measure(run.journal(), wall_seconds=run.wall - 1000.0)
    # Steps 1-5 of the first attempt and 6-10 of the second are what the weights hold.
    kept = [(e.step, e.kept) for e in executions(run.journal())]
    assert kept == [(s, s <= 5) for s in range(1, 7)] + [(s, True) for s in range(6, 11)]
    assert (m.kept_steps, m.steps_lost) == (10, 1)
    assert m.kept_seconds == pytest.approx(10.0)  # the restart's 10 s are not training
    assert m.ettr < measure(clean.journal(), wall_seconds=clean.wall - 1000.0).ettr
    (kill,) = m.incidents
    assert kill.kind == "kill" and kill.outcome == "detected" and "restart" in kill.detectors
    # From the kill to the first good step past step 6, after the restart and load.
    step_7 = next(e for e in run.events if e.kind == "step" and e.step == 7)
    assert kill.recovered_at_step == 7
    assert kill.mttr == pytest.approx(step_7.wall - fault_wall)


def test_a_skipped_step_is_lost_and_a_guarded_nan_recovers_at_the_next_step() -> None:
    run = Clock().start().steps(1, 4)
    run.at("fault_injected", 5, after=0.1, fault="nan_grad", details={"plan_index": 0})
    run.at("step", 5, after=0.9, loss=float("nan"), skipped=True, tokens=100)
    run.steps(6, 8)
    m = measure(run.journal(), wall_seconds=10.0)
    assert (m.kept_steps, m.steps_lost) == (7, 1)
    (nan,) = m.incidents
    assert nan.outcome == "detected" and nan.detectors == ("skipped_step",)
    assert nan.recovered_at_step == 6 and nan.mttr == pytest.approx(1.9)


def test_a_fault_nothing_answered_is_missed_and_not_timed() -> None:
    run = Clock().start().steps(1, 4)
    run.at("fault_injected", 5, after=0.1, fault="grad_underflow", details={"plan_index": 0})
    run.steps(5, 8)
    (quiet,) = measure(run.journal(), wall_seconds=10.0).incidents
    assert quiet.outcome == "missed" and quiet.mttr is None and quiet.detectors == ()


def test_checkpoint_damage_no_load_reached_is_latent_and_a_refused_load_is_detected() -> None:
    run = Clock().start().steps(1, 4)
    run.at("fault_injected", 4, after=0.1, fault="truncate", details={"plan_index": 0})
    run.steps(5, 8)
    (latent,) = measure(run.journal(), wall_seconds=10.0).incidents
    assert latent.outcome == "latent"
    # The same damage, met by a later kill's restart: the load fails, another is taken.
    run = Clock().start().steps(1, 4)
    run.at("fault_injected", 4, after=0.1, fault="truncate", details={"plan_index": 0})
    run.steps(5, 6).at("fault_injected", 7, fault="kill", details={"plan_index": 1})
    run.restart = 1
    run.start().at("file_load_failed", 0, path="step-4/data", error="truncated")
    run.at("file_loaded", 0, path="step-2/data", intact=True)
    run.steps(3, 8)
    truncate, kill = measure(run.journal(), wall_seconds=20.0).incidents
    assert truncate.outcome == "detected" and truncate.detectors == ("checkpoint_integrity",)
    assert kill.outcome == "detected" and kill.kind == "kill"


def test_faults_that_found_nothing_are_counted_apart() -> None:
    run = Clock().start().steps(1, 3)
    run.at("fault_skipped", 2, fault="swap", reason="no checkpoint", details={"plan_index": 0})
    m = measure(run.journal(), wall_seconds=5.0)
    assert m.incidents == () and m.skipped_faults == {"swap": 1}


def test_the_ettr_curve_ends_at_the_run_s_ettr_and_never_exceeds_one() -> None:
    run = Clock().start(after=0.0).steps(1, 50)
    m = measure(run.journal(), wall_seconds=50.0)
    assert m.curve[-1][1] == pytest.approx(m.ettr, abs=0.02)
    assert all(0 <= e <= 1 for _, e in m.curve)


def test_mttr_by_kind_summarises_each_kind() -> None:
    run = Clock().start().steps(1, 2)
    for n, step in enumerate((3, 6)):
        run.at("fault_injected", step, after=0.1, fault="nan_grad", details={"plan_index": n})
        run.at("step", step, after=0.9, loss=float("nan"), skipped=True)
        run.steps(step + 1, step + 2)
    row = measure(run.journal(), wall_seconds=20.0).mttr_by_kind()["nan_grad"]
    assert row["faults"] == 2 and row["detected"] == 2 and row["unrecovered"] == 0
    assert row["median"] == pytest.approx(1.9) and row["max"] == pytest.approx(1.9)


def test_damage_to_a_checkpoint_no_load_went_to_stays_latent() -> None:
    run = Clock().start().steps(1, 4)
    damaged = {"plan_index": 0, "file": "/r/checkpoints/step-00000002/state.pt"}
    run.at("fault_injected", 4, after=0.1, fault="zero_page", details=damaged)
    run.at("checkpoint_loaded", 4, path="/r/checkpoints/step-00000004")  # another folder
    run.steps(5, 6)
    (other,) = measure(run.journal(), wall_seconds=10.0).incidents
    assert other.outcome == "latent"
    # The negative control: the same load of the damaged folder, with nothing refused.
    run = Clock().start().steps(1, 4)
    run.at("fault_injected", 4, after=0.1, fault="zero_page", details=damaged)
    run.at("checkpoint_loaded", 4, path="/r/checkpoints/step-00000002")
    run.steps(3, 6)
    (hit,) = measure(run.journal(), wall_seconds=10.0).incidents
    assert hit.outcome == "missed"
