"""``--executor ray``: every faulted run and every fault-free baseline is one Ray task.

A task asks for the run's ``world_size`` CPUs (and as many GPUs when its trainer asks for
CUDA), runs the same launch as a local run on the node it lands on (`ray_node`) and sends
back the files judging reads (`run_files`: through Ray's object store, or over a shared
``--run-root``). The runner judges them here, on the driver, as it judges a local run's.

A task lost with its node (or its worker) is the cluster's failure: it is run again, on a
node that is still there, and the lost attempt is named in the scenario's result
(``lost_attempts``); it never counts for or against the trainer. A run the trainer itself
failed comes back as any failed run does and is never retried. docs/cluster.md.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.errors import TightropeError
from harness.run_layout import RunLayout
from harness.running.baseline import (
    BASELINE_STOPPED,
    BaselineError,
    baseline_key,
    cache_lock,
    code_version,
)
from harness.running.executor import CLUSTER_ERROR, BaselineRan, Ran
from harness.running.launch import Launch
from harness.running.run_files import READ_CHECKPOINTS, copy_run, unpack
from harness.suites.scenario import Scenario, TrainerSpec

#: Attempts lost to the cluster a run may have before it is given up as a cluster error.
RETRIES = 3
_INSTALL = "pip install 'tightrope[ray]'"


class ExecutorError(TightropeError):
    """The executor cannot run here: Ray missing, its cluster unreachable, a run it cannot
    place, or a node with other code than the driver's."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ExecutorError(f"--executor ray needs Ray, not installed: {_INSTALL}") from None
    return ray


def gpus(spec: TrainerSpec) -> int:
    """GPUs a run asks for: one per rank when its trainer names CUDA (its command, or
    ``CUDA_VISIBLE_DEVICES`` in its environment), else none."""
    asks = "cuda" in (spec.command or "").lower() or "CUDA_VISIBLE_DEVICES" in spec.env
    return spec.world_size if asks else 0


_HOST_PORT = re.compile(r"^(?:ray://)?\[?([^\[\]]+?)\]?:(\d+)$")


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse a ``HOST:PORT`` (or ``ray://HOST:PORT``) that takes no connection within
    ``timeout`` seconds: Ray itself waits a minute and more before it gives up."""
    found = _HOST_PORT.match(address)
    if found is None:
        return  # auto, or a form Ray resolves itself
    host, port = found.group(1), int(found.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ExecutorError(
            f"cannot reach a Ray cluster at --ray-address {address}: {exc.strerror or exc}; "
            "start one (`ray start --head`, docs/cluster.md) or name its address"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


class RayExecutor:
    """Runs launches as tasks on the Ray cluster at ``address`` (``auto``: the one this
    machine belongs to), or on the one this process already joined."""

    name = "ray"

    def __init__(
        self, address: str = "auto", *, run_root: Path | None = None, retries: int = RETRIES
    ) -> None:
        ray = _ray()
        self._owned = not ray.is_initialized()
        if self._owned:
            check_reachable(address)
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ExecutorError(
                    f"cannot reach a Ray cluster at --ray-address {address}: {_first_line(exc)}; "
                    "start one (`ray start --head`, docs/cluster.md) or name its address"
                ) from None
        alive = [n for n in ray.nodes() if n.get("Alive")]
        cpus = [float(n.get("Resources", {}).get("CPU", 0)) for n in alive]
        self.nodes, self.cpus = len(alive), int(sum(cpus))
        self._largest = int(max(cpus, default=0))
        self.run_root = None if run_root is None else str(run_root.resolve())
        self.retries = retries
        self._code = code_version()
        from harness.running.ray_node import baseline_on_node, faulted_on_node

        self._faulted = ray.remote(faulted_on_node)
        self._baseline = ray.remote(baseline_on_node)

    def close(self) -> None:
        """Leave the cluster (when this executor joined it)."""
        if self._owned:
            _ray().shutdown()

    def slots(self, asked: int) -> int:
        return max(1, self.cpus)  # Ray queues what does not fit; --cores is this machine's

    def take(self, ranks: int) -> int:
        return 0

    def give(self, taken: int) -> None:
        return None

    def faulted(
        self,
        scenario: Scenario,
        run_dir: Path,
        plan: Path | None,
        poll: Callable[[], None],
        stop: threading.Event,
        owner: Mapping[str, str],
    ) -> Ran:
        if scenario.trainer.launcher == "docker":
            raise ExecutorError(
                f"scenario {scenario.name}: launcher docker starts its own nodes on this "
                "machine; run it with --executor local"
            )
        checkpoints = bool(READ_CHECKPOINTS & set(scenario.expect.checks()))
        args = (
            scenario.model_dump(mode="json", by_alias=True),
            RunLayout(run_dir).plan.read_text(),
            self.run_root,
            checkpoints,
            os.environ.get("OMP_NUM_THREADS"),
        )
        reply, lost = self._call(self._faulted, args, scenario.trainer, stop)
        if reply is None:
            return Ran(Launch(None, False, 0.0, interrupted=True), lost)
        self._receive(reply, run_dir, checkpoints)
        launch = dict(reply["launch"])
        launch["left_processes"] = tuple(launch.get("left_processes") or ())
        return Ran(Launch(**launch), lost, str(reply["node"]))

    def baseline(
        self,
        spec: TrainerSpec,
        cache_dir: Path,
        *,
        use_cache: bool,
        on_poll: Callable[[Path], None] | None,
        stop: threading.Event,
    ) -> BaselineRan:
        key = baseline_key(spec)
        with cache_lock(cache_dir, key) as run_dir:
            if use_cache and RunLayout(run_dir).baseline_done.is_file():
                return BaselineRan(run_dir)  # whichever node ran it
            args = (spec.model_dump(mode="json"), self.run_root, os.environ.get("OMP_NUM_THREADS"))
            reply, lost = self._call(self._baseline, args, spec, stop)
            if reply is None:
                raise BaselineError(BASELINE_STOPPED)
            partial = run_dir.with_name(f".{key}.{uuid.uuid4().hex[:8]}.partial")
            self._receive(reply, partial, checkpoints=True)
            shutil.rmtree(run_dir, ignore_errors=True)
            partial.rename(run_dir)  # whole or absent
            if reply["error"]:
                raise BaselineError(f"{reply['error']} (on node {reply['node']}: {run_dir})")
        return BaselineRan(run_dir, lost)

    def _receive(self, reply: dict[str, Any], run_dir: Path, checkpoints: bool) -> None:
        """The files of a finished task into ``run_dir``; its code checked against ours."""
        if reply["code"] != self._code:
            raise ExecutorError(
                f"node {reply['node']} runs other tightrope code ({reply['code'][:12]}) than "
                f"this driver ({self._code[:12]}): install the same on every node "
                "(docs/cluster.md)"
            )
        if reply["files"] is not None:
            unpack(reply["files"], run_dir)
            return
        copy_run(Path(reply["at"]), run_dir, checkpoints=checkpoints)
        shutil.rmtree(reply["scratch"], ignore_errors=True)

    def _call(
        self, task: Any, args: tuple[Any, ...], spec: TrainerSpec, stop: threading.Event
    ) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
        """Run ``task`` until an attempt is not lost to the cluster: its reply (None when
        stopped) and the lost attempts. The task's own error is raised as it was."""
        ray = _ray()
        if spec.world_size > self._largest:
            raise ExecutorError(
                f"a run of {spec.world_size} ranks needs {spec.world_size} CPUs on one node; "
                f"the cluster's largest node has {self._largest}"
            )
        lost: list[str] = []
        for attempt in range(1, self.retries + 2):
            options = {"num_cpus": spec.world_size, "num_gpus": gpus(spec), "max_retries": 0}
            ref = task.options(**options).remote(*args)
            try:
                return _wait(ray, ref, stop), tuple(lost)
            except ray.exceptions.TaskCancelledError:
                return None, tuple(lost)
            except ray.exceptions.RayTaskError as exc:
                raise (exc.cause if isinstance(exc.cause, Exception) else exc) from None
            except ray.exceptions.RayError as exc:
                lost.append(f"attempt {attempt} lost: {_first_line(exc)}")
        raise ExecutorError(f"{CLUSTER_ERROR} every attempt was lost: " + "; ".join(lost))


def _wait(ray: Any, ref: Any, stop: threading.Event) -> dict[str, Any]:
    """The task's reply; once ``stop`` is set, the task is cancelled (its launch killed)."""
    while not ray.wait([ref], timeout=0.5)[0]:
        if stop.is_set():
            ray.cancel(ref)
            break
    reply: dict[str, Any] = ray.get(ref)
    return reply
