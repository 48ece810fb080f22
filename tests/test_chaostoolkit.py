"""The Chaos Toolkit extension: its probes judge from the journal and the scorecard (with
negative controls), its background jobs leave nothing behind, and the example experiment
holds under the real ``chaos run`` against a live reference run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.errors import TightropeError
from harness.integrations.chaostoolkit import actions, probes
from harness.records.journal import JournalWriter
from harness.run_layout import RunLayout
from harness.running import background
from harness.running.process_tree import descendants, marked
from harness.scorecard.jsonio import dumps_scorecard

from .oracle_runs import Run, nan_grad_run
from .scorecard_support import make_suite

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = ROOT / "examples" / "chaostoolkit" / "experiment.json"
CHAOS = Path(sys.executable).with_name("chaos")
needs_chaos = pytest.mark.skipif(
    not CHAOS.exists(), reason="chaostoolkit is not installed (pip install 'tightrope[chaos]')"
)

# -- probes on a journal -------------------------------------------------------------------


def test_probes_see_a_fault_caught_and_a_finite_loss(tmp_path: Path) -> None:
    nan_grad_run(tmp_path, at=15).close()
    run_dir = str(tmp_path)
    assert probes.loss_is_finite(run_dir) is True
    assert probes.undetected_faults(run_dir) == 0
    seen = probes.fault_detected(run_dir, kind="nan_grad", wait_s=0)
    assert seen["fired"] and seen["detected"]
    assert (seen["step"], seen["latency_steps"]) == (15, 0)
    # The skipped step is what was observed; the guard's claim counts because it backs it.
    assert seen["detected_by"] == ["nonfinite_guard", "skipped_step"]
    status = probes.run_status(run_dir)
    assert status["running"] is False and status["step"] == 30
    assert [f["fault"] for f in status["fired"]] == ["nan_grad"]
    assert status["processes"] is None  # no job of ours was started there
    json.dumps(status, allow_nan=False)  # it goes into Chaos Toolkit's journal as is


def test_probes_fail_a_fault_nothing_answered_and_a_nan_loss(tmp_path: Path) -> None:
    """Negative control: a claim with no observed response is no detection; NaN fails."""
    run = Run(tmp_path).steps(1, 14).fault(15).step(15, loss=math.nan).detect(15)
    run.step(16, loss=math.nan).close()
    run_dir = str(tmp_path)
    assert probes.loss_is_finite(run_dir) is False
    assert probes.undetected_faults(run_dir) == 1
    seen = probes.fault_detected(run_dir, wait_s=0)
    assert seen["fired"] and not seen["detected"]
    assert seen["unbacked_claims"] == ["nonfinite_guard"] and seen["latency_steps"] is None
    assert probes.run_status(run_dir)["loss"] == "nan"


def test_no_evidence_is_no_pass(tmp_path: Path) -> None:
    with pytest.raises(TightropeError, match="no journal in"):
        probes.loss_is_finite(str(tmp_path))  # a probe error: the hypothesis is not met
    Run(tmp_path).close()  # started, not one step journaled
    assert probes.loss_is_finite(str(tmp_path)) is False
    assert probes.fault_detected(str(tmp_path), wait_s=0) == {
        "fired": False,
        "detected": False,
        "fault": None,
        "step": None,
    }
    Run(tmp_path / "nan-weights").steps(1, 5, params_finite=False).close()
    assert probes.loss_is_finite(str(tmp_path / "nan-weights")) is False  # finite loss


def test_training_means_new_steps_keep_coming(tmp_path: Path) -> None:
    writer = JournalWriter(tmp_path, 0, 0)
    writer.emit("run_start", 0, world_size=1, pid=1, host="h")
    writer.emit("step", 1, loss=4.0)
    # Started and not ended, but stuck at step 1: not training.
    assert probes.job_is_training(str(tmp_path), within_s=0.5) is False
    later = threading.Timer(0.3, lambda: writer.emit("step", 2, loss=3.9))
    later.start()
    try:
        assert probes.job_is_training(str(tmp_path), within_s=5) is True
    finally:
        later.join()
    writer.emit("run_end", 2, status="completed")
    writer.close()
    assert probes.job_is_training(str(tmp_path), within_s=0) is False


# -- probes on a scorecard -----------------------------------------------------------------


def test_scorecard_probes_read_the_saved_figures(tmp_path: Path) -> None:
    (tmp_path / "scorecard.json").write_text(dumps_scorecard(make_suite(tmp_path)))
    # Weights 1, 2, 1; scores 1 (passed), 1/2 (one of two checks), 0 (errored).
    assert probes.resilience_score(str(tmp_path)) == pytest.approx(100 * (1 + 2 * 0.5) / 4)
    assert probes.suite_passed(str(tmp_path)) is False
    results = probes.check_results(str(tmp_path))
    assert results["counts"] == {"passed": 1, "failed": 1, "error": 1}
    crash = results["scenarios"]["crash-resume"]
    assert crash["status"] == "failed"
    assert crash["checks"]["recovery_latency"]["status"] == "failed"
    assert crash["checks"]["loss_gap"]["status"] == "passed"
    assert results["scenarios"]["corrupt-checkpoint"]["error"].startswith("trainer exited")
    json.dumps(results, allow_nan=False)


def test_a_missing_scorecard_is_named(tmp_path: Path) -> None:
    with pytest.raises(TightropeError, match=r"holds no scorecard\.json"):
        probes.resilience_score(str(tmp_path))


# -- actions -------------------------------------------------------------------------------

# A leader that starts a worker in a session of its own (as torchrun does) and waits.
_LEADER = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
    "start_new_session=True); time.sleep(60)"
)
# One that ignores SIGTERM: only SIGKILL ends it.
_STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"
)


def _start(tmp_path: Path, code: str, processes: int = 1) -> background.Record:
    record = background.start(
        [sys.executable, "-c", code],
        record_path=RunLayout(tmp_path).background,
        log=RunLayout(tmp_path).log,
        env=dict(os.environ),
    )
    deadline = time.monotonic() + 10
    while len(background.alive(record)) < processes:
        assert time.monotonic() < deadline, "the background job did not start"
        time.sleep(0.05)
    return record


def test_a_stopped_job_leaves_no_process_behind(tmp_path: Path) -> None:
    record = _start(tmp_path, _LEADER, processes=2)
    with pytest.raises(TightropeError, match="already has a job running"):
        _start(tmp_path, _LEADER)
    stopped = actions.stop_training(str(tmp_path), grace_s=5)
    assert stopped == {"was_running": True, "ended_gracefully": True, "killed": 0, "left": 0}
    assert marked(record.mark) == []
    again = actions.stop_training(str(tmp_path))  # a rollback played twice
    assert again["was_running"] is False


def test_a_job_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    record = _start(tmp_path, _STUBBORN)
    deadline = time.monotonic() + 10
    while "ready" not in RunLayout(tmp_path).log.read_text():  # SIGTERM is ignored from now
        assert time.monotonic() < deadline, "the stubborn job did not start"
        time.sleep(0.05)
    stopped = actions.stop_training(str(tmp_path), grace_s=0.5)
    assert stopped == {"was_running": True, "ended_gracefully": False, "killed": 1, "left": 0}
    assert marked(record.mark) == []


def test_bad_action_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(TightropeError, match=r"start_training: steps: .*greater than or equal"):
        actions.start_training(str(tmp_path), steps=0)
    with pytest.raises(TightropeError, match="model: "):
        actions.start_training(str(tmp_path), model="huge")
    with pytest.raises(TightropeError, match="has no control channel"):
        actions.inject(str(tmp_path), "nan_grad")
    with pytest.raises(TightropeError, match="cannot be injected live"):
        actions.inject(str(tmp_path), "duplicate_contamination", params={"rate": 0.01})
    with pytest.raises(TightropeError, match="is not a file"):
        actions.start_suite(str(tmp_path / "none.yaml"), str(tmp_path / "card"))
    assert not RunLayout(tmp_path).background.exists()  # nothing was started


def test_a_suite_started_in_the_background_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIGHTROPE_CACHE", str(tmp_path / "cache"))  # not the checkout's
    card = tmp_path / "card"
    started = actions.start_suite(str(ROOT / "scenarios" / "smoke.yaml"), str(card))
    deadline = time.monotonic() + 60
    while not (trainers := _trainers(started["pid"])):  # the suite is under way
        assert time.monotonic() < deadline, "the suite launched no trainer"
        time.sleep(0.1)
    stopped = actions.stop_suite(str(card), grace_s=30)
    assert stopped == {"was_running": True, "ended_gracefully": True, "killed": 0, "left": 0}
    assert not any(Path(f"/proc/{pid}").exists() for pid in trainers)
    card_json = json.loads((card / "scorecard.json").read_text())
    assert card_json["interrupted"] is True  # SIGTERM ended it as Ctrl-C does


def _trainers(pid: int) -> list[int]:
    found = []
    for child in descendants(pid):
        try:
            if b"reference_trainer" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            continue
    return found


def test_waiting_for_a_suite_gives_its_exit_code(tmp_path: Path) -> None:
    suite = tmp_path / "bad.yaml"
    suite.write_text("name: bad\nscenarios: [{name: x, trainer: {steps: 0}}]\n")
    card = tmp_path / "card"
    actions.start_suite(str(suite), str(card))
    assert actions.wait_for_suite(str(card), timeout_s=60)["exit_code"] == 2  # invalid suite
    assert "steps" in (card / actions.SUITE_LOG).read_text()  # the error, as tightrope said it
    with pytest.raises(TightropeError, match="no suite was started"):
        actions.wait_for_suite(str(tmp_path / "other"))


# -- the example experiment ----------------------------------------------------------------


def _chaos(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [str(CHAOS), "--no-version-check", "--settings", str(tmp_path / "settings.yaml"),
         "--log-file", str(tmp_path / "chaostoolkit.log"), *args],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@needs_chaos
def test_the_example_experiment_is_valid(tmp_path: Path) -> None:
    """Every module, function and argument of the experiment binds (chaos validate)."""
    done = _chaos(tmp_path, "validate", str(EXPERIMENT))
    assert done.returncode == 0, done.stdout + done.stderr
    broken = json.loads(EXPERIMENT.read_text())
    broken["method"][0]["provider"]["arguments"]["in_step"] = 2  # a typo
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    done = _chaos(tmp_path, "validate", str(tmp_path / "broken.json"))
    assert done.returncode != 0 and "in_step" in done.stdout + done.stderr


@needs_chaos
def test_a_job_that_will_not_start_interrupts_the_experiment(tmp_path: Path) -> None:
    """Negative control of the control: no job, no hypothesis checked against nothing."""
    experiment = json.loads(EXPERIMENT.read_text())
    experiment["controls"][0]["provider"]["arguments"]["steps"] = 0
    (tmp_path / "bad-job.json").write_text(json.dumps(experiment))
    done = _chaos(
        tmp_path, "run", "--journal-path", str(tmp_path / "journal.json"),
        str(tmp_path / "bad-job.json"), env={"TIGHTROPE_CHAOS_RUN_DIR": str(tmp_path / "run")},
    )  # fmt: skip
    assert done.returncode == 1
    assert "start_training: steps: Input should be greater than or equal to 1" in (
        done.stdout + done.stderr
    )
    journal = json.loads((tmp_path / "journal.json").read_text())
    assert journal["status"] == "interrupted" and journal["run"] == []
    assert journal["steady_states"]["before"] is None  # nothing was judged


@needs_chaos
@pytest.mark.slow
def test_the_experiment_holds_against_a_live_reference_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    journal_path = tmp_path / "journal.json"
    try:
        done = _chaos(
            tmp_path, "run", "--journal-path", str(journal_path), str(EXPERIMENT),
            env={"TIGHTROPE_CHAOS_RUN_DIR": str(run_dir), "TIGHTROPE_CHAOS_STEPS": "400"},
            timeout=120,
        )  # fmt: skip
    finally:
        record = background.read_record(RunLayout(run_dir).background)
        left = marked(record.mark) if record is not None else []
        if record is not None:
            background.stop(record, grace=0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert left == [], "the experiment left the job running"
    journal = json.loads(journal_path.read_text())
    assert (journal["status"], journal["deviated"]) == ("completed", False)
    for phase in ("before", "after"):
        state = journal["steady_states"][phase]
        assert state["steady_state_met"] is True, state
        assert all(p["tolerance_met"] for p in state["probes"])
    runs = {r["activity"]["name"]: r for r in journal["run"]}
    armed = runs["inject-nan-grad"]["output"]
    seen = runs["nan-grad-fired-and-detected"]["output"]
    assert seen["fired"] and seen["detected"], seen
    assert seen["step"] == armed["effective_step"] and seen["latency_steps"] == 0
    (stop,) = journal["rollbacks"]
    assert stop["status"] == "succeeded" and stop["output"]["was_running"] is True
    assert stop["output"]["left"] == 0
