"""What one Ray task does on the node it lands on: the same launch as a local run, in a
scratch run dir of that node (or under the shared ``--run-root``), and what judging needs
sent back (`harness.running.run_files`). The driver judges; nothing here does.

A node the cluster loses takes its trainer with it on a real cluster; a worker that dies
alone (killed, out of memory) must not leave one training, so each task starts a reaper
(`harness.running.ray_reaper`) that kills the launch's processes if the worker dies first.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from harness.run_layout import RunLayout
from harness.running.baseline import BaselineError, baseline_key, baseline_run, code_version
from harness.running.executor import launch_faulted
from harness.running.ray_reaper import TASK_ENV
from harness.running.run_files import pack
from harness.running.run_lock import RunDirLock
from harness.suites.scenario import Scenario, TrainerSpec

T = TypeVar("T")


@functools.cache
def _code() -> str:
    return code_version()


def _node() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def _scratch(run_root: str | None, name: str) -> Path:
    """A fresh run dir for one attempt: under the shared run root, or this node's temp."""
    if run_root is not None:
        path = Path(run_root) / f"{name}-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True)
        return path
    return Path(tempfile.mkdtemp(prefix=f"tightrope-{name}-"))


@contextlib.contextmanager
def _reaper(token: str) -> Iterator[None]:
    """A watcher that kills every process marked ``token`` if this worker dies first."""
    env = {k: v for k, v in os.environ.items() if k != TASK_ENV}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "harness.running.ray_reaper", str(os.getpid()), token],
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        watcher.kill()
        watcher.wait()


def _stoppable(run: Callable[[threading.Event], T]) -> T:
    """``run(stop)`` in a thread; a cancel of the task (KeyboardInterrupt here) sets ``stop``,
    so the launch kills its processes and ends as an interrupted one. What ``run`` raised is
    raised here."""
    stop, box = threading.Event(), dict[str, Any]()

    def target() -> None:
        try:
            box["value"] = run(stop)
        except BaseException as exc:  # handed to the task's thread, raised there
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    while thread.is_alive():
        try:
            thread.join(0.2)
        except KeyboardInterrupt:
            stop.set()
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def _environment(driver_omp: str | None) -> None:
    """The trainer's environment as the driver's: Ray sets OMP_NUM_THREADS for a task."""
    if driver_omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = driver_omp


def _reply(run_dir: Path, scratch: Path, run_root: str | None, checkpoints: bool) -> dict[str, Any]:
    """Where the driver finds the files: packed here (the scratch dir removed), or at their
    shared path (the driver removes ``scratch`` once it has copied them)."""
    found = {"node": _node(), "code": _code(), "scratch": str(scratch)}
    if run_root is not None:
        return found | {"at": str(run_dir), "files": None}
    files = pack(run_dir, checkpoints=checkpoints)
    shutil.rmtree(scratch, ignore_errors=True)
    return found | {"at": None, "files": files}


def faulted_on_node(
    scenario_data: dict[str, Any],
    plan_text: str,
    run_root: str | None,
    checkpoints: bool,
    driver_omp: str | None,
) -> dict[str, Any]:
    """Run the scenario's faulted run here; its launch and its files (a Ray task)."""
    scenario = Scenario.model_validate(scenario_data)
    _environment(driver_omp)
    run_dir, token = _scratch(run_root, scenario.name), uuid.uuid4().hex
    with RunDirLock.acquire(run_dir) as claim, _reaper(token):
        plan = RunLayout(run_dir).plan
        plan.write_text(plan_text)
        given = plan if scenario.faults else None
        owner = {**claim.env(), TASK_ENV: token}
        launch = _stoppable(
            lambda stop: launch_faulted(scenario, run_dir, given, lambda: None, stop, owner=owner)
        )
    return {"launch": asdict(launch)} | _reply(run_dir, run_dir, run_root, checkpoints)


def baseline_on_node(
    spec_data: dict[str, Any], run_root: str | None, driver_omp: str | None
) -> dict[str, Any]:
    """Run the fault-free baseline of ``spec`` here, whole (a cached baseline keeps its
    checkpoints); its key, the error when it failed, and its files (a Ray task)."""
    spec = TrainerSpec.model_validate(spec_data)
    _environment(driver_omp)
    cache = _scratch(run_root, "baseline")
    error = None
    token = uuid.uuid4().hex
    os.environ[TASK_ENV] = token  # (baseline_run takes no owner environment)
    try:
        with _reaper(token):
            run_dir = _stoppable(lambda stop: baseline_run(spec, cache, use_cache=False, stop=stop))
    except BaselineError as exc:
        error, run_dir = str(exc), cache / "baselines" / baseline_key(spec)
    finally:
        os.environ.pop(TASK_ENV, None)
    reply = {"key": baseline_key(spec), "error": error}
    return reply | _reply(run_dir, cache, run_root, checkpoints=True)
