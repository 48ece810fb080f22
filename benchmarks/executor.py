"""Executor overhead: one sweep run locally (the named baseline) and on a two-node Ray
cluster on this same machine, in the same command: what ``--executor ray`` itself costs.

The sweep is the tiny reference trainer under NaN gradients, guards on and off, over
``--seeds`` seeds (12 steps, no fault-free baseline: every run is one launch). Locally it
fills ``--cores`` 2; the cluster is `ray.cluster_utils.Cluster` with two nodes of one CPU
each on loopback, so both run two launches at a time on the same cores. Each run's own cost
is the driver's time for it less its launch's time (``seconds - run_seconds`` of its
result): locally the plan, the journal read and the judging; on the cluster also the task's
round trip (scheduling, a worker, the files packed and sent back through the object store).
The difference of their medians is the executor's cost per run. The cluster's start-up is
timed apart: it is paid once per command, not per run.

    .venv/bin/python benchmarks/executor.py [--seeds 4] [--out benchmarks/results/executor.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.sweeps.run_sweep import SweepOptions, SweepRun, run_sweep  # noqa: E402
from harness.sweeps.sweep_file import parse_sweep  # noqa: E402

NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}


def _sweep(seeds: int) -> Any:
    return parse_sweep(
        {
            "sweep": "executor-bench",
            "scenario": {
                "trainer": {"model": "tiny", "steps": 12, "checkpoint_every": 6, "timeout": 300},
                "faults": [{"kind": "nan_grad", "at_step": 8}],
                "expect": {"completed": True, "params_finite": True},
            },
            "grid": {"preset": ["reference", "fragile"]},
            "seeds": seeds,
        },
        "executor-bench",
    )


def _figures(name: str, run: SweepRun, wall: float) -> dict[str, Any]:
    own = [r.result.seconds - (r.result.run_seconds or 0.0) for r in run.records]
    launch = [r.result.run_seconds or 0.0 for r in run.records]
    return {
        "executor": name,
        "runs": len(run.records),
        "wall_s": round(wall, 2),
        "median_launch_s": round(statistics.median(launch), 2),
        "median_own_s": round(statistics.median(own), 3),
        "statuses": [r.result.status for r in run.records],
        "lost_attempts": sum(len(r.result.lost_attempts) for r in run.records),
    }


def _two_nodes(cluster_class: Any) -> Any:
    """Head and second node; Ray gives a raylet 30 s to register, which a loaded machine can
    miss: a start that timed out is torn down and tried again (twice)."""
    for tries_left in (2, 1, 0):
        cluster = cluster_class()
        try:
            cluster.add_node(include_dashboard=False, **NODE)
            cluster.add_node(**NODE)
            return cluster
        except Exception:
            cluster.shutdown()
            if not tries_left:
                raise
    raise AssertionError("unreachable")


def _on_cluster(sweep: Any, tmp: Path) -> tuple[dict[str, Any], float]:
    import ray
    from ray.cluster_utils import Cluster

    from harness.running.ray_executor import RayExecutor

    started = time.monotonic()
    cluster = _two_nodes(Cluster)
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        executor = RayExecutor()
        start_up = time.monotonic() - started
        options = SweepOptions(
            tmp / "ray", cores=2, cache_dir=tmp / "cache-ray", progress=False, executor=executor
        )
        clock = time.monotonic()
        run = run_sweep(sweep, options)
        return _figures("ray, 2 nodes x 1 CPU", run, time.monotonic() - clock), start_up
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4, help="seeds per cell (2 cells)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/executor.json")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sweep = _sweep(args.seeds)
    with tempfile.TemporaryDirectory(prefix="executor-bench-") as name:
        tmp = Path(name)
        clock = time.monotonic()
        local_run = run_sweep(
            sweep, SweepOptions(tmp / "local", cores=2, cache_dir=tmp / "cache", progress=False)
        )
        local = _figures("local, --cores 2", local_run, time.monotonic() - clock)
        cluster, start_up = _on_cluster(sweep, tmp)
    per_run = cluster["median_own_s"] - local["median_own_s"]
    same = local["statuses"] == cluster["statuses"]
    result = {
        "benchmark": "executor",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "baseline": local,
        "ray": cluster | {"cluster_start_s": round(start_up, 1)},
        "overhead_per_run_s": round(per_run, 3),
        "wall_ratio": round(cluster["wall_s"] / local["wall_s"], 2),
        "same_statuses": same,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    table = Table(title=f"one sweep of {local['runs']} runs (baseline: local)")
    for column in ("executor", "wall s", "x local", "launch s (median)", "own s/run (median)"):
        table.add_column(column, justify="left" if column == "executor" else "right")
    for row in (local, cluster):
        table.add_row(
            row["executor"],
            f"{row['wall_s']:.1f}",
            f"{row['wall_s'] / local['wall_s']:.2f}",
            f"{row['median_launch_s']:.2f}",
            f"{row['median_own_s']:.3f}",
        )
    Console().print(table)
    print(
        f"executor cost per run: {per_run:+.3f} s; cluster start-up {start_up:.1f} s (once); "
        f"same statuses: {same}"
    )
    print(f"wrote {args.out}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
