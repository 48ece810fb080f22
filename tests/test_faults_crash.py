"""Crashing, wedged and out-of-memory ranks (faults/crash.py, gil.py, oom.py): each kind
acts for real in a real process (an exception in the thread named, a signal the kernel
sends, the GIL held, the allocator's refusal), names the rank it hit, and leaves no core
file and no thread behind."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from faults.crash import (
    WORKER_THREAD,
    AbortInjector,
    AbortSpec,
    RankExceptionInjector,
    RankExceptionSpec,
    SegfaultInjector,
    SegfaultSpec,
)
from faults.errors import FaultSpecError, InjectionError
from faults.gil import HOLDER_THREAD, GilLockInjector, GilLockSpec
from faults.injector import Injection, StepContext
from faults.oom import OomInjector, OomSpec
from faults.registry import parse_fault
from harness.soak.plan import draw_plan, soak_kinds

ROOT = Path(__file__).resolve().parent.parent


def context(
    rank: int = 1, world_size: int = 2, **kw: object
) -> tuple[StepContext, list[Injection]]:
    handed: list[Injection] = []
    ctx = StepContext(step=7, rank=rank, world_size=world_size, record_now=handed.extend, **kw)  # type: ignore[arg-type]
    return ctx, handed


def test_the_kinds_parse_and_refuse_bad_fields() -> None:
    assert (
        parse_fault({"kind": "rank_exception", "at_step": 3, "thread": "worker"}).thread == "worker"
    )  # type: ignore[attr-defined]
    for bad in (
        {"kind": "rank_exception", "at_step": 3, "thread": "loader"},
        {"kind": "rank_exception", "at_step": 3, "exception": "SystemExit"},
        {"kind": "gil_lock", "at_step": 3, "seconds": 0},
        {"kind": "segfault", "at_step": 3, "signal": "SIGBUS"},
        {"kind": "oom", "at_step": 3, "target": ""},
    ):
        with pytest.raises(FaultSpecError, match=r"thread|exception|seconds|signal|target"):
            parse_fault(bad)


def test_rank_exception_in_the_main_thread_is_journaled_first_then_raised() -> None:
    spec = RankExceptionSpec(at_step=7, ranks=[1], exception="OSError", message="disk gone")
    ctx, handed = context()
    with pytest.raises(OSError, match="disk gone"):
        RankExceptionInjector(spec).before_forward(ctx)
    assert [(r.fault, r.details["rank"], r.details["thread"]) for r in handed] == [
        ("rank_exception", 1, "main")
    ]
    other, none = context(rank=0)
    assert RankExceptionInjector(spec).before_forward(other) == [] and none == []


def test_rank_exception_in_a_worker_thread_reaches_the_loop_as_a_data_loader_hands_it() -> None:
    spec = RankExceptionSpec(at_step=7, ranks=[1], thread="worker", exception="KeyError")
    ctx, handed = context()
    with pytest.raises(KeyError) as caught:
        RankExceptionInjector(spec).before_forward(ctx)
    assert f"Caught KeyError in thread {WORKER_THREAD}" in str(caught.value)
    cause = caught.value.__cause__
    assert isinstance(cause, KeyError) and cause.__traceback__ is not None
    assert handed[0].details["thread"] == "worker"
    assert not [t for t in threading.enumerate() if t.name == WORKER_THREAD]


CRASH = """
import faulthandler, os, sys
from faults.injector import StepContext
from faults.crash import {injector}, {spec}
faulthandler.enable()
handed = []
def record(records):
    handed.extend(records)
    print("journaled", records[0].details["rank"], records[0].details["signal"], flush=True)
ctx = StepContext(step=3, rank=1, world_size=2, record_now=record)
{injector}({spec}(at_step=3, ranks=[1])).end_step(ctx)
print("survived", flush=True)
"""


@pytest.mark.parametrize(
    ("injector", "spec", "signum", "words"),
    [
        ("SegfaultInjector", "SegfaultSpec", signal.SIGSEGV, "Segmentation fault"),
        ("AbortInjector", "AbortSpec", signal.SIGABRT, "Aborted"),
    ],
)
def test_a_fatal_signal_kills_the_rank_by_that_signal_with_no_core_file(
    tmp_path: Path, injector: str, spec: str, signum: int, words: str
) -> None:
    code = CRASH.format(injector=injector, spec=spec)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == -signum, done.stderr
    assert done.stdout.splitlines() == [f"journaled 1 {signal.Signals(signum).name}"]
    assert f"Fatal Python error: {words}" in done.stderr  # faulthandler's report
    assert "Traceback" not in done.stderr  # no Python exception on the way
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("core")]


def test_a_fatal_signal_spares_the_ranks_it_does_not_target() -> None:
    ctx, handed = context(rank=0)
    assert SegfaultInjector(SegfaultSpec(at_step=7, ranks=[1])).end_step(ctx) == []
    assert AbortInjector(AbortSpec(at_step=7, ranks=[1])).end_step(ctx) == []
    assert handed == []


def test_gil_lock_stops_every_other_thread_of_the_process() -> None:
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    time.sleep(0.1)
    interval = sys.getswitchinterval()
    ctx, handed = context()
    started = time.monotonic()
    assert GilLockInjector(GilLockSpec(at_step=7, ranks=[1], seconds=1.0)).before_forward(ctx) == []
    held = time.monotonic() - started
    stop.set()
    ticker.join()
    inside = [t for t in ticks if started + 0.05 < t < started + 0.95]
    assert held >= 1.0 and inside == []  # the ticker never ran while the GIL was held
    assert handed[0].details == {
        "rank": 1, "pid": os.getpid(), "seconds": 1.0, "thread": HOLDER_THREAD
    }  # fmt: skip
    assert sys.getswitchinterval() == interval
    assert not [t for t in threading.enumerate() if t.name == HOLDER_THREAD]


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_oom_fails_a_real_allocation_in_the_forward_pass_then_goes() -> None:
    model = Tiny()
    ctx, _ = context(model=model)
    injector = OomInjector(OomSpec(at_step=7, ranks=[1], target="b"))
    records = injector.before_forward(ctx)
    assert records[0].details["rank"] == 1 and records[0].details["first"] == "b"
    assert copy.deepcopy(model)(torch.ones(2, 4)).shape == (2, 1)  # a copy carries no fault
    with pytest.raises(MemoryError, match="can't allocate memory") as caught:
        model(torch.ones(2, 4))
    assert isinstance(caught.value.__cause__, RuntimeError)  # the allocator's own error
    assert "DefaultCPUAllocator" in str(caught.value.__cause__)
    injector.end_step(ctx)
    assert model(torch.ones(2, 4)).shape == (2, 1)


def test_oom_names_the_modules_it_could_not_find() -> None:
    ctx, _ = context(model=Tiny())
    with pytest.raises(InjectionError, match=r"no module matches target 'blocks\.\*'"):
        OomInjector(OomSpec(at_step=7, target="blocks.*")).before_forward(ctx)


def test_the_soak_draws_the_crash_kinds_with_their_fields() -> None:
    crash_kinds = ["rank_exception", "segfault", "abort", "gil_lock", "oom"]
    assert set(crash_kinds) <= set(soak_kinds())
    plan = draw_plan(seed=3, steps=200, rate=0.5, kinds=crash_kinds)
    drawn = {f.kind for f in plan.faults}
    assert drawn == set(crash_kinds)
    for fault in plan.faults:
        assert fault.at_step is not None and fault.target_ranks(2)  # each hits some rank
        if isinstance(fault, GilLockSpec):
            assert 0 < fault.seconds <= 60
