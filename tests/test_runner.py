"""The runner: any trainer by command, a watchdog that never lets a run hang the suite, crashes
scored as errors with their log, baselines cached by configuration and code."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from faults.proc_stat import state as proc_state
from harness.running.baseline import baseline_key
from harness.running.runner import Runner, RunOptions, run_suite
from harness.suites.scenario import TrainerSpec
from harness.suites.suite_loader import parse_suite

ROOT = Path(__file__).resolve().parent.parent
PLAIN = f"{sys.executable} {ROOT / 'tests' / 'plain_train.py'} --steps {{steps}}"


def scenario(**fields: Any) -> Any:
    data = {"name": "s", "expect": {"completed": True}} | fields
    return parse_suite({"scenarios": [data]}, "<test>").scenarios[0]


def runner(tmp_path: Path) -> Runner:
    return Runner(RunOptions(out_dir=tmp_path / "out", cache_dir=tmp_path / "cache"))


@pytest.mark.slow
def test_a_plain_trainer_runs_through_the_zero_code_attach(tmp_path: Path) -> None:
    s = scenario(
        trainer={"command": PLAIN, "steps": 6, "checkpoint_every": 6},
        faults=[{"kind": "nan_grad", "at_step": 3}],
        expect={"completed": True, "params_finite": True},
    )
    result = runner(tmp_path).scenario(s)
    run_dir = tmp_path / "out" / "runs" / "s"
    # The plain script has no NaN guard: its weights turn NaN, and the oracle sees it.
    assert result.status == "failed" and [c.name for c in result.failed_checks] == ["params_finite"]
    assert (run_dir / "plan.yaml").is_file() and (run_dir / "journal" / "rank-0.jsonl").is_file()
    assert "final loss nan" in (run_dir / "trainer.log").read_text()


@pytest.mark.timed
@pytest.mark.slow
def test_the_watchdog_kills_a_hung_trainer_and_scores_it_as_an_error(tmp_path: Path) -> None:
    # A trainer that stops itself (SIGSTOP) ignores everything but SIGKILL.
    hang = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGSTOP)'"
    s = scenario(
        trainer={"command": hang, "timeout": 3, "steps": 5, "checkpoint_every": 5},
        expect={"params_finite": True},  # no fault-free run needed: the faulted one hangs
    )
    started = time.monotonic()
    result = runner(tmp_path).scenario(s)
    assert time.monotonic() - started < 30
    assert result.status == "error" and result.score == 0
    assert result.error is not None and "timed out" in result.error
    assert result.exit_code is None


@pytest.mark.slow
def test_a_crashing_trainer_is_an_error_with_its_log_tail(tmp_path: Path) -> None:
    crash = f"{sys.executable} -c 'import sys; sys.exit(\"out of cheese at step 0\")'"
    s = scenario(
        trainer={"command": crash, "steps": 5, "checkpoint_every": 5},
        expect={"params_finite": True},
    )
    result = runner(tmp_path).scenario(s)
    assert result.status == "error" and result.score == 0
    assert result.error is not None and "the agent never attached" in result.error
    assert "out of cheese at step 0" in result.log_tail


@pytest.mark.slow
def test_a_missing_baseline_is_an_error_not_a_crash(tmp_path: Path) -> None:
    broken = f"{sys.executable} -c 'raise SystemExit(5)'"
    s = scenario(
        trainer={"command": broken, "steps": 5, "checkpoint_every": 5},
        expect={"final_loss_within": 0.1},
    )
    result = runner(tmp_path).scenario(s)
    assert result.status == "error"
    assert result.error is not None and "baseline run exited with code 5" in result.error


@pytest.mark.slow
def test_baselines_are_cached_by_configuration(tmp_path: Path) -> None:
    s = scenario(
        trainer={"command": PLAIN, "steps": 4, "checkpoint_every": 4},
        expect={"completed": True, "final_loss_within": 0.5},
    )
    first = runner(tmp_path).scenario(s)
    assert first.status == "passed", first.checks
    key = baseline_key(s.trainer)
    done = tmp_path / "cache" / "baselines" / key / "baseline.json"
    stamp = done.stat().st_mtime_ns
    second = runner(tmp_path).scenario(s)
    assert second.status == "passed" and done.stat().st_mtime_ns == stamp  # not run again
    assert second.baseline_dir == f"baselines/{key}"
    assert (tmp_path / "out" / second.baseline_dir / "journal" / "rank-0.jsonl").is_file()


def test_the_baseline_key_follows_configuration_and_code() -> None:
    spec = TrainerSpec(steps=20)
    assert baseline_key(spec, "code-a") == baseline_key(TrainerSpec(steps=20), "code-a")
    assert baseline_key(spec, "code-a") != baseline_key(spec, "code-b")
    assert baseline_key(spec, "code-a") != baseline_key(TrainerSpec(steps=21), "code-a")
    # How long the watchdog waits, or a stop and resume, does not change what is computed.
    assert baseline_key(spec, "c") == baseline_key(TrainerSpec(steps=20, timeout=9), "c")
    assert baseline_key(spec, "c") == baseline_key(TrainerSpec(steps=20, resume_after=5), "c")


@pytest.mark.slow
def test_a_suite_run_records_seeds_and_keeps_every_run(tmp_path: Path) -> None:
    suite = parse_suite(
        {
            "suite": "two",
            "defaults": {"trainer": {"command": PLAIN, "steps": 4, "checkpoint_every": 4}},
            "scenarios": [
                {"name": "a", "trainer": {"seed": 3}, "expect": {"completed": True}},
                {"name": "b", "expect": {"max_lost_steps": 0}},
            ],
        },
        "<test>",
    )
    out = tmp_path / "out"
    result = run_suite(suite, RunOptions(out_dir=out, cache_dir=tmp_path / "c"), progress=False)
    assert [(r.name, r.seed, r.status) for r in result.scenarios] == [
        ("a", 3, "passed"),
        ("b", 0, "passed"),
    ]
    assert result.passed and result.score == 100.0 and result.preset == "command"
    for name in ("a", "b"):
        assert json.loads((out / "runs" / name / "journal" / "rank-0.jsonl").read_text()
                          .splitlines()[0])["kind"] == "run_start"  # fmt: skip


@pytest.mark.slow
def test_a_trainer_whose_steps_cannot_be_found_errors_with_the_reason(tmp_path: Path) -> None:
    # Forward only, under no_grad: nothing the agent can call a training step.
    no_grad = (
        f"{sys.executable} -c 'import torch; m = torch.nn.Linear(2, 2); "
        "torch.no_grad().__enter__(); m(torch.ones(1, 2)); "
        'torch.save(m.state_dict(), "w.pt")\''
    )
    s = scenario(trainer={"command": no_grad, "steps": 5, "checkpoint_every": 5})
    result = runner(tmp_path).scenario(s)
    assert result.status == "error", result
    assert result.error is not None and "found no training step" in result.error
    assert "no module ran forward with grad" in result.error
    # It ran in its own run dir: the file it wrote is the scenario's, not the caller's.
    assert (tmp_path / "out" / "runs" / "s" / "w.pt").is_file() and not Path("w.pt").exists()


@pytest.mark.slow
def test_an_orphaned_child_of_the_trainer_is_ended_with_the_launch(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    orphan = (
        f"{sys.executable} -c 'import os, subprocess, sys; "
        'p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], '
        f'start_new_session=True); open("{pid_file}", "w").write(str(p.pid))\''
    )
    s = scenario(trainer={"command": orphan, "steps": 5, "checkpoint_every": 5})
    runner(tmp_path).scenario(s)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        if proc_state(pid) == "Z":
            break  # a zombie waiting for its reaper is ended
        time.sleep(0.1)
    alive = Path(f"/proc/{pid}").exists() and proc_state(pid) != "Z"
    assert not alive


def test_a_crash_names_the_last_error_of_every_attempt(tmp_path: Path) -> None:
    from harness.records.journal import JournalWriter, read_journal
    from harness.running.launch import Launch
    from harness.running.runner import _crash

    for attempt, why in enumerate(["UnpicklingError: invalid load key", "EOFError: truncated"]):
        writer = JournalWriter(tmp_path, 0, attempt)
        writer.emit("run_start", 0, world_size=1, pid=1, host="h")
        writer.emit("run_end", 3, status="failed", reason=why)
        writer.close()
    error = _crash(Launch(1, False, 1.0), read_journal(tmp_path), 60)
    assert error == (
        "the trainer crashed (exit code 1); attempt 0, rank 0: UnpicklingError: invalid load "
        "key; attempt 1, rank 0: EOFError: truncated"
    )


@pytest.mark.parametrize(("gave_up", "reason"), [(True, "x"), (False, "recovery exhausted: see")])
def test_only_a_run_end_that_says_it_gave_up_is_judged_rather_than_crashed(
    tmp_path: Path, gave_up: bool, reason: str
) -> None:
    from harness.records.journal import JournalWriter, read_journal
    from harness.running.launch import Launch
    from harness.running.runner import _crash

    writer = JournalWriter(tmp_path, 0, 0)
    writer.emit("run_start", 0, world_size=1, pid=1, host="h")
    writer.emit(
        "run_end", 3, status="failed", reason=reason, **({"gave_up": True} if gave_up else {})
    )
    writer.close()
    error = _crash(Launch(1, False, 1.0), read_journal(tmp_path), 60)
    # The field decides, not the wording of the reason (which a trainer may phrase any way).
    assert (error is None) == gave_up
