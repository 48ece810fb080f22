"""``--executor ray`` on a two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`,
two CPUs on the head, one on the second node, so that what is left after the loss still runs
two at a time): three scenarios of the smoke suite (a numeric fault, a damaged checkpoint, a
killed process restarted by torchrun) and a small sweep run on it at once, the second node
is removed while both nodes run a task, and every scenario and every sweep run ends with the
same status and check results as the same runs made locally. The task lost with the node
is run again on the head and marked in the scorecard; nothing of Ray's is left afterwards.

The local runs are made after the cluster's, reusing the fault-free baselines the cluster
shipped back into the cache (the cache is keyed by configuration and code, so a rerun takes
what any node finished); every faulted run is made again, locally, and judged again.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from faults.proc_stat import state as proc_state
from harness.running import warm_start
from harness.running.process_tree import descendants
from harness.running.ray_executor import RayExecutor
from harness.running.results import ScenarioResult, SuiteResult
from harness.running.runner import RunOptions, run_suite
from harness.scorecard.render.markdown import render_markdown
from harness.suites.suite_loader import load_suite
from harness.sweeps.run_sweep import SweepOptions, run_sweep
from harness.sweeps.sweep_file import parse_sweep

from .conftest import ROOT

# Torchrun (node-loss) and a recovery's seconds (its mttr check): the serial lane.
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timed]

SWEEP = {
    "sweep": "guard-on-off",
    "description": "NaN gradients with the guards on and off: one run passes, one fails.",
    "scenario": {
        "trainer": {"model": "tiny", "steps": 12, "checkpoint_every": 6, "timeout": 180},
        "faults": [{"kind": "nan_grad", "at_step": 8}],
        "expect": {"completed": True, "params_finite": True},
    },
    "grid": {"preset": ["reference", "fragile"]},
    "seeds": 1,
}
NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
HEAD = {**NODE, "num_cpus": 2}
#: The smoke scenarios run on the cluster: one of each way a run's files matter to the
#: driver (the journal only; the checkpoints it loaded; a restart's two attempts).
SCENARIOS = ["nan-grad", "truncated-checkpoint", "node-loss"]
#: Ray's per-node agents: they outlive `Cluster.shutdown()` for as long as the process that
#: started the cluster lives (seen with Ray 2.60), so the test ends them itself.
_AGENT = re.compile(rb"ray::(DashboardAgent|RuntimeEnvAgent)\b")


class _Watch:
    """Every process this test started, seen while the cluster lives (a process orphaned
    by the removed node is reparented away from us, so it is remembered beforehand)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        # Those of earlier tests still serving this worker (warm-start servers) are not ours.
        self.earlier = set(descendants(os.getpid()))

    def look(self) -> None:
        # A warm-start server this test's local runs started serves the worker until the
        # session ends (its children, the trainers, are still watched).
        ours = set(descendants(os.getpid())) - self.earlier - warm_start.server_pids()
        self.seen.update(ours)

    def alive(self, *, agents: bool = True) -> list[str]:
        """What is still running, one line each (Ray's per-node agents left out unless
        ``agents``)."""
        left = []
        for pid in sorted(self.seen):
            try:
                state = proc_state(pid)
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if state != "Z" and (agents or not _AGENT.match(command)):
                left.append(f"{pid} {command.decode(errors='replace')[:120]}")
        return left

    def end_agents(self) -> None:
        for line in self.alive():
            pid, command = line.split(" ", 1)
            if _AGENT.match(command.encode()):
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)


def _start(watch: _Watch) -> tuple[Cluster, Any]:
    """The head and a second node. Ray gives a raylet 30 s to register, which a loaded
    2-core machine can miss: a start that timed out is torn down and tried again."""
    for tries_left in (2, 1, 0):
        cluster = Cluster()
        try:
            cluster.add_node(include_dashboard=False, **HEAD)
            return cluster, cluster.add_node(**NODE)
        except Exception:
            watch.look()
            cluster.shutdown()
            if not tries_left:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def two_nodes() -> Iterator[tuple[Cluster, Any, _Watch]]:
    watch = _Watch()
    cluster, second = _start(watch)
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        watch.look()
        yield cluster, second, watch
    finally:
        watch.look()
        ray.shutdown()
        cluster.shutdown()
        deadline = time.monotonic() + 20
        while watch.alive(agents=False) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = watch.alive(agents=False)
        watch.end_agents()
    # The raylets, the GCS, every worker, trainer and reaper: gone by themselves.
    assert not left, "left running after the cluster's shutdown:\n" + "\n".join(left)


def _training_under(node: Any) -> bool:
    """A trainer runs under the node's raylet (started by one of its workers)."""
    raylet = node.all_processes["raylet"][0].process.pid
    for pid in descendants(raylet):
        with contextlib.suppress(OSError):
            if b"reference_trainer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
    return False


def _outcome(r: ScenarioResult) -> tuple[str, str | None, list[tuple[str, str]]]:
    return r.status, r.error, [(c.name, c.status) for c in r.checks]


def test_smoke_scenarios_and_a_sweep_on_two_nodes_judge_as_locally_when_one_node_is_lost(
    tmp_path: Path, two_nodes: tuple[Cluster, Any, _Watch]
) -> None:
    cluster, second, watch = two_nodes
    suite = load_suite(ROOT / "scenarios" / "smoke.yaml")
    sweep = parse_sweep(SWEEP, "guard-on-off.yaml")
    cache = tmp_path / "cache"
    executor = RayExecutor()
    assert (executor.nodes, executor.cpus) == (2, 3)
    second_id = second.node_id
    on_cluster: dict[str, Any] = {}

    def suite_job() -> None:
        options = RunOptions(tmp_path / "ray-card", cores=2, cache_dir=cache, executor=executor)
        on_cluster["suite"] = run_suite(suite, options, select=SCENARIOS, progress=False)

    def sweep_job() -> None:
        options = SweepOptions(
            tmp_path / "ray-sweep", cores=2, cache_dir=cache, progress=False, executor=executor
        )
        on_cluster["sweep"] = run_sweep(sweep, options)

    jobs = [threading.Thread(target=job, daemon=True) for job in (suite_job, sweep_job)]
    for job in jobs:
        job.start()
    removed = False
    while any(job.is_alive() for job in jobs):
        time.sleep(0.5)
        watch.look()
        # The second node goes while a trainer of one of its tasks is training (a task only
        # leased there, not yet started, Ray itself places again, unseen).
        if not removed and _training_under(second):
            time.sleep(3)
            watch.look()
            cluster.remove_node(second, allow_graceful=False)
            removed = True
    for job in jobs:
        job.join()
    assert removed

    local_suite = run_suite(
        suite,
        RunOptions(tmp_path / "card", cores=2, cache_dir=cache),
        select=SCENARIOS,
        progress=False,
    )
    local_sweep = run_sweep(
        sweep,
        SweepOptions(tmp_path / "sweep", cores=2, cache_dir=cache, use_cache=False, progress=False),
    )

    ray_suite = on_cluster["suite"]
    for r in [*ray_suite.scenarios, *(r.result for r in on_cluster["sweep"].records)]:
        print(f"on the cluster: {r.name} {r.status} on {r.ran_on} lost {r.lost_attempts}")  # -s
    assert [r.name for r in ray_suite.scenarios] == [r.name for r in local_suite.scenarios]
    assert [r.name for r in local_suite.scenarios] == SCENARIOS
    assert {r.name: _outcome(r) for r in ray_suite.scenarios} == {
        r.name: _outcome(r) for r in local_suite.scenarios
    }
    ray_runs = {(r.cell, r.seed): r for r in on_cluster["sweep"].records}
    local_runs = {(r.cell, r.seed): r for r in local_sweep.records}
    assert sorted(ray_runs) == sorted(local_runs) and len(ray_runs) == 2
    assert {k: _outcome(r.result) for k, r in ray_runs.items()} == {
        k: _outcome(r.result) for k, r in local_runs.items()
    }
    assert [r.result.status for r in local_sweep.records] == ["passed", "failed"]
    # The same runs: the same losses to the last bit (nan for the unguarded run), wherever
    # they ran.
    assert {k: repr(r.final_loss) for k, r in ray_runs.items()} == {
        k: repr(r.final_loss) for k, r in local_runs.items()
    }

    # The lost task is marked where it was lost, and finished on the head.
    results = [*ray_suite.scenarios, *(r.result for r in on_cluster["sweep"].records)]
    rerun = [r for r in results if r.lost_attempts]
    assert rerun, "no run was marked as lost with the removed node"
    for r in rerun:
        assert all(second_id in line for line in r.lost_attempts), r.lost_attempts
        assert r.ran_on is not None and r.ran_on != second_id
    assert all(r.ran_on is not None for r in results)
    assert all(not r.lost_attempts and r.ran_on is None for r in local_suite.scenarios)
    shown = render_markdown(SuiteResult(suite="lost", preset="reference", scenarios=rerun))
    assert "Run again after a lost cluster node" in shown and second_id in shown
