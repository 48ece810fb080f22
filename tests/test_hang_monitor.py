"""The hang monitor: kills a rank whose heartbeat goes stale, journals it, and leaves a rank
that keeps beating alone; the heartbeat's timeout is learned from step times."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from reference_trainer.processes.hang_monitor import behind
from reference_trainer.processes.watchdog import Heartbeat, WatchdogConfig

# It judges heartbeat ages in seconds (run one at a time: tests/conftest.py).
pytestmark = pytest.mark.timed


def write_beat(
    run_dir: Path,
    rank: int,
    step: int,
    *,
    age: float,
    timeout: float,
    pid: int,
    clock_stepped: float = 0.0,
) -> None:
    """A heartbeat written ``age`` seconds ago, on a wall clock since stepped forward by
    ``clock_stepped`` seconds (an NTP step, a virtual machine paused and resumed)."""
    path = RunLayout(run_dir).heartbeat_file(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    wall, mono = time.time() - age - clock_stepped, time.monotonic() - age
    record = {"step": step, "wall": wall, "mono": mono, "timeout": timeout, "pid": pid}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record | {"host": "h", "restart": 0}))
    tmp.replace(path)  # as the rank writes it: never half a heartbeat


def monitor(run_dir: Path, pid: int, world_size: int = 2) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "reference_trainer.processes.hang_monitor",
        "--run-dir",
        str(run_dir),
    ]
    argv += ["--rank", "1", "--world-size", str(world_size), "--pid", str(pid), "--poll", "0.05"]
    return subprocess.Popen(argv)


@pytest.fixture
def rank_process() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_stale_heartbeat_is_journaled_and_its_rank_killed(
    tmp_path: Path, rank_process: subprocess.Popen[bytes]
) -> None:
    write_beat(tmp_path, 0, 15, age=0.0, timeout=1.0, pid=1)  # the peer got further
    write_beat(tmp_path, 1, 14, age=3.0, timeout=1.0, pid=rank_process.pid)
    started = time.monotonic()
    assert monitor(tmp_path, rank_process.pid).wait(timeout=30) == 1
    assert rank_process.wait(timeout=10) == -9  # SIGKILL: a stopped process heeds nothing else
    assert time.monotonic() - started < 10
    journal = read_journal(tmp_path)
    (detected,) = journal.of_kind("detected")
    assert detected["detector"] == "hang_watchdog" and detected.rank == 1
    assert detected["details"]["lost_ranks"] == [1] and detected["details"]["stalled_seconds"] > 1
    (lost,) = journal.of_kind("rank_lost")
    assert lost["lost_rank"] == 1 and "past step 14" in lost["reason"]


@pytest.mark.parametrize("stepped", [0.0, 60.0], ids=["steady-clock", "clock-stepped-60s"])
def test_a_rank_that_keeps_beating_is_left_alone(
    tmp_path: Path, rank_process: subprocess.Popen[bytes], stepped: float
) -> None:
    """Also when the wall clock jumps forward between its beats and the monitor's looks:
    each heartbeat is 60 s old by the wall clock, and fresh by the monotonic one (a worker
    of this suite, training in-process, was killed so when its virtual machine resumed)."""
    beat = {"timeout": 0.5, "pid": rank_process.pid, "clock_stepped": stepped}
    write_beat(tmp_path, 1, 0, age=0.0, **beat)
    watcher = monitor(tmp_path, rank_process.pid, world_size=1)
    for step in range(1, 31):  # 1.5 s of progress against a 0.5 s timeout
        write_beat(tmp_path, 1, step, age=0.0, **beat)
        time.sleep(0.05)
    assert watcher.poll() is None and rank_process.poll() is None
    RunLayout(tmp_path).heartbeat_file(1).unlink()  # the rank ended on its own
    assert watcher.wait(timeout=10) == 0
    assert rank_process.poll() is None
    assert not (tmp_path / "journal").exists()


def test_the_monitor_leaves_when_its_rank_exits(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_beat(tmp_path, 1, 3, age=100.0, timeout=1.0, pid=gone.pid)
    assert monitor(tmp_path, gone.pid).wait(timeout=10) == 0
    assert not (tmp_path / "journal").exists()


def test_the_rank_that_fell_behind_is_named() -> None:
    now = time.time()
    beats = {0: {"step": 15, "wall": now}, 1: {"step": 14, "wall": now - 9}}
    assert behind(beats, now) == [1]
    assert behind({0: {"step": 5, "wall": now - 1}, 1: {"step": 5, "wall": now - 4}}, now) == [1]
    assert behind({}, now) == []


def test_the_timeout_is_learned_from_step_times(tmp_path: Path) -> None:
    config = WatchdogConfig(initial_timeout=60, safety_factor=4, min_timeout=0.2)
    beat = Heartbeat(config, tmp_path, rank=0, restart=0, world_size=1)
    beat.beat(0)
    assert beat.timeout == 60  # nothing learned yet: start-up may be slow
    for step in range(1, 6):
        time.sleep(0.1)
        beat.beat(step)
    assert 0.4 <= beat.timeout <= 2.0  # 4 x the slowest of ~0.1 s steps
    saved = json.loads(RunLayout(tmp_path).heartbeat_file(0).read_text())
    assert saved["step"] == 5 and saved["timeout"] == beat.timeout
    with pytest.raises(ValueError, match=r"stability\.watchdog\.min_timeout"):
        WatchdogConfig(initial_timeout=1, min_timeout=5)


@pytest.mark.parametrize("announced", [True, False], ids=["announced", "unannounced"])
def test_a_one_time_slow_load_is_allowed_and_not_learned(tmp_path: Path, announced: bool) -> None:
    # The floor holds for beats up to 0.125 s apart (4 x 0.125): back-to-back beats stay
    # under it on a machine loaded many times over.
    config = WatchdogConfig(initial_timeout=60, safety_factor=4, min_timeout=0.5)
    beat = Heartbeat(config, tmp_path, rank=0, restart=0, world_size=1)
    for step in range(5):
        beat.beat(step)  # fast steps: the learned timeout is the floor
    assert beat.timeout == 0.5
    heartbeat = RunLayout(tmp_path).heartbeat_file(0)
    if announced:
        with beat.slow():  # as the embedding model's load is wrapped
            during = json.loads(heartbeat.read_text())
            time.sleep(1.0)
        assert during["timeout"] == 60 and during["step"] == 4  # no progress claimed
    else:  # the negative control: the same pause, unannounced, is learned as a slow step
        time.sleep(1.0)
    beat.beat(5)
    assert (beat.timeout < 1.0) == announced
