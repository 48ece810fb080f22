"""`tightrope exec --timeout`: a command that outlives its deadline is killed, all of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults.proc_stat import state as proc_state
from harness.commands.main import main as tightrope

from .conftest import ROOT

# It judges a deadline in seconds (run one at a time: tests/conftest.py).
pytestmark = pytest.mark.timed

#: Starts two sleeping children, one in its own session as torchrun starts its workers,
#: writes its pid and theirs to the file in argv[1], then sleeps for a minute.
SLEEPER = (
    "import os, subprocess, sys, time; "
    "nap = [sys.executable, '-c', 'import time; time.sleep(60)']; "
    "kids = [subprocess.Popen(nap), subprocess.Popen(nap, start_new_session=True)]; "
    "pids = [os.getpid(), *[k.pid for k in kids]]; "
    "open(sys.argv[1] + '.tmp', 'w').write(' '.join(map(str, pids))); "
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1]); "
    "time.sleep(60)"
)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie left for init to reap does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return proc_state(pid) != "Z"
    except (OSError, IndexError):
        return False


def gone(pids: list[int], within: float = 5.0) -> bool:
    """True when none of ``pids`` runs, waiting up to ``within`` s for the kernel to finish."""
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def read_pids(path: Path, within: float = 30.0) -> list[int]:
    """The pids the sleeper wrote, once it has written them."""
    deadline = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < deadline, f"the command never wrote {path}"
        time.sleep(0.02)
    return [int(p) for p in path.read_text().split()]


def test_a_command_past_its_timeout_is_killed_with_its_children(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pids = tmp_path / "pids"
    argv = ["exec", "--run-dir", str(tmp_path / "run"), "--timeout", "1", "--"]
    started = time.monotonic()
    code = tightrope([*argv, sys.executable, "-c", SLEEPER, str(pids)])
    seconds = time.monotonic() - started
    assert code == 124
    assert 1.0 <= seconds < 3.0, f"took {seconds:.2f} s"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tightrope exec: timed out after 1 s; killed the command"]
    command, *children = read_pids(pids)
    with pytest.raises(ProcessLookupError):
        os.kill(command, 0)  # killed and reaped by exec
    assert gone(children), "a child of the command outlived the timeout"


def test_a_command_within_its_timeout_keeps_its_exit_code(tmp_path: Path) -> None:
    argv = ["exec", "--run-dir", str(tmp_path / "run"), "--timeout", "30", "--"]
    assert tightrope([*argv, sys.executable, "-c", "import sys; sys.exit(3)"]) == 3


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_timeout_must_be_positive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    argv = ["exec", "--run-dir", str(tmp_path / "run"), "--timeout", value, "--"]
    assert tightrope([*argv, sys.executable, "-c", "pass"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"tightrope: error: --timeout must be a number of seconds greater than 0, got {value}"
    ]
    assert not (tmp_path / "run").exists()


def test_sigterm_to_exec_reaches_the_command_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    cli = [sys.executable, "-m", "harness", "exec", "--run-dir", str(tmp_path / "run")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [*cli, "--timeout", "60", "--", sys.executable, "-c", SLEEPER, str(pids)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.DEVNULL,  # a pipe would stay open in the child left running
    )
    started: list[int] = []
    try:
        started = read_pids(pids)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        proc.kill()
        for pid in started[2:]:  # its own session: a real launcher passes SIGTERM on itself
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM  # the command's death, shell-style
    assert gone(started[:2])
