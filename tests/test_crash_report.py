"""The reference trainer's crash reports (reference_trainer/processes/crash_report.py): a rank
that dies by a fatal signal leaves faulthandler's report in its own file, read back as the
signal, the rank, its last step and where it died; an exception names its type, unless
it only says a peer failed; a run that ends well leaves no report and faulthandler as it
found it."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.records.events import Detected, RankBlamed
from harness.run_layout import RunLayout
from reference_trainer.processes.crash_report import (
    Cause,
    CrashReport,
    exception_cause,
    restart_reason,
    signal_causes,
)

ROOT = Path(__file__).resolve().parent.parent
DIE = """
import sys
from pathlib import Path
from faults.crash import {injector}, {spec}
from faults.injector import StepContext
from harness.records.journal import JournalWriter
from reference_trainer.processes.crash_report import CrashReport
run_dir, rank = Path(sys.argv[1]), int(sys.argv[2])
with JournalWriter(run_dir, rank, restart=0) as journal:
    journal.emit("run_start", 0, world_size=2, pid=0, host="h")
    for step in (1, 2, 3):
        journal.emit("step", step, loss=1.0)
CrashReport(run_dir, rank, 0).install()
{injector}({spec}(at_step=3)).end_step(StepContext(step=3, rank=rank, world_size=2))
"""


def die(run_dir: Path, rank: int, injector: str, spec: str) -> int:
    code = DIE.format(injector=injector, spec=spec)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", code, str(run_dir), str(rank)]
    return subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False).returncode


@pytest.mark.slow
def test_a_rank_dead_by_a_signal_is_read_back_from_its_report(tmp_path: Path) -> None:
    assert die(tmp_path, 1, "SegfaultInjector", "SegfaultSpec") == -signal.SIGSEGV
    assert die(tmp_path, 0, "AbortInjector", "AbortSpec") == -signal.SIGABRT
    causes = signal_causes(tmp_path, 0)
    assert [(c.rank, c.step, c.how, c.what) for c in causes] == [
        (0, 3, "signal", "SIGABRT"),
        (1, 3, "signal", "SIGSEGV"),
    ]
    # Where it died: the innermost Python frame of the crashing thread.
    assert causes[1].message.endswith("in string_at")  # ctypes, reading the null field
    assert signal_causes(tmp_path, 1) == []  # another attempt: nothing
    reason = restart_reason(causes)
    assert "rank 0 died by SIGABRT after step 3" in reason
    assert "rank 1 died by SIGSEGV after step 3" in reason
    detected, blamed = causes[1].claims()
    assert isinstance(detected, Detected) and detected.detector == "rank_crash"
    assert isinstance(blamed, RankBlamed) and blamed.blamed_rank == 1


def test_a_run_that_ends_well_leaves_no_report_and_faulthandler_as_it_was(
    tmp_path: Path,
) -> None:
    was = faulthandler.is_enabled()
    report = CrashReport(tmp_path, 0, 0)
    report.install()
    assert faulthandler.is_enabled() and RunLayout(tmp_path).crash_file(0, 0).exists()
    report.uninstall()
    assert faulthandler.is_enabled() == was
    assert not RunLayout(tmp_path).crash_file(0, 0).exists()


def test_an_exception_names_its_type_and_an_out_of_memory_its_own_detector() -> None:
    cause = exception_cause(RuntimeError("bad batch\nmore lines"), 1, 7)
    assert cause == Cause(1, 7, "exception", "RuntimeError", "bad batch")
    assert cause.detector == "rank_crash"
    assert exception_cause(MemoryError("no room"), 0, 3).detector == "out_of_memory"  # type: ignore[union-attr]
    oom = exception_cause(torch.OutOfMemoryError("CUDA out of memory"), 0, 3)
    assert oom is not None and oom.detector == "out_of_memory"


def test_an_exception_that_only_says_a_peer_failed_blames_nobody() -> None:
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:1")
    assert exception_cause(gloo, 0, 15) is None
    assert exception_cause(torch.distributed.DistBackendError("NCCL error"), 0, 15) is None
