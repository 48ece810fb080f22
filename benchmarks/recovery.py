"""Recovery time: MTTR of a killed, a hung and a preempted rank, against the restart floor.

The floor, measured in the same run, is what any restart must pay before training again:
the workers start, import torch, join the process group and load the checkpoint. It is
timed as ``--resume`` of a saved run to the end of its first step, less that step's own
time and less torchrun's own start (timed with workers that do nothing), since a restart
reuses the launcher that is already running. Each fault then runs as a scenario of the
harness (2 ranks, the reference trainer, torchrun with restarts); the MTTR is the
scenario's own figure, from the fault to the first good step after recovery. For the
hang, the time from the fault to the watchdog's ``detected`` is reported too.
Targets: MTTR <= 2x the floor for kill and preempt; a hang detected within 3x the median
step time plus the floor.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.records.journal import Journal, read_journal
from harness.running.runner import RunOptions, run_suite
from harness.suites.suite_loader import parse_suite

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
FAULTS = {
    "kill": {"kind": "kill", "at_step": 15, "ranks": [1]},
    "hang": {"kind": "hang", "at_step": 15, "ranks": [1]},
    "preempt": {"kind": "preempt", "at_step": 15, "ranks": [1], "grace_seconds": 10},
}


def _journal(run_dir: Path) -> Journal:
    return read_journal(run_dir, warn=False)


def launcher(world_size: int, env: dict[str, str]) -> float:
    """Seconds torchrun itself takes to start and stop workers that do nothing."""
    started = time.time()
    subprocess.run([*TORCHRUN, str(world_size), "--no-python", "true"], cwd=ROOT, env=env,
                   check=True, capture_output=True)  # fmt: skip
    return time.time() - started


def floor(tmp: Path, world_size: int, env: dict[str, str]) -> float:
    """Seconds from launching a resume to its first step, less that step's own time and
    less torchrun's own start (a restart reuses the running launcher)."""
    run_dir = tmp / "floor"
    base = ["-m", "reference_trainer", "--preset", "tiny", "--run-dir", str(run_dir)]
    first = [*TORCHRUN, str(world_size), *base, "--steps", "11", "--checkpoint-every", "10"]
    first += ["--stop-after", "10"]
    subprocess.run(first, cwd=ROOT, env=env, check=True, capture_output=True)
    started = time.time()
    resume = [*TORCHRUN, str(world_size), *base, "--resume", "--steps", "11"]
    subprocess.run(resume, cwd=ROOT, env=env, check=True, capture_output=True)
    step = next(e for e in _journal(run_dir).of_kind("step") if e.step == 11 and e.rank == 0)
    return step.wall - started - float(step["step_time"]) - launcher(world_size, env)


def scenarios(tmp: Path, world_size: int) -> dict[str, dict[str, Any]]:
    """MTTR (and detection time) of each fault, from the harness's own checks."""
    suite = parse_suite(
        {
            "suite": "recovery",
            "defaults": {
                "trainer": {"world_size": world_size, "steps": 30, "checkpoint_every": 10},
                "expect": {"completed": True, "mttr": {"max_seconds": 300}},
            },
            "scenarios": [{"name": n, "faults": [f]} for n, f in FAULTS.items()],
        },
        "<benchmark>",
    )
    options = RunOptions(out_dir=tmp / "runs", cache_dir=tmp / "cache", cores=world_size)
    result = run_suite(suite, options, progress=False)
    rows: dict[str, dict[str, Any]] = {}
    for r in result.scenarios:
        mttr = next(c for c in r.checks if c.name == "mttr")
        journal = _journal(tmp / "runs" / r.run_dir)
        fault = journal.of_kind("fault_injected")[0]
        detected = [e for e in journal.of_kind("detected", "rank_lost") if e.wall >= fault.wall]
        times = [float(e["step_time"]) for e in journal.of_kind("step") if e.rank == 0]
        rows[r.name] = {
            "status": r.status,
            "mttr_s": mttr.figure,
            "mttr_steps": mttr.figures.get("steps"),
            "detect_s": round(detected[0].wall - fault.wall, 2) if detected else None,
            "median_step_s": statistics.median(times),
        }
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/recovery.json")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    with tempfile.TemporaryDirectory(prefix="recovery-") as name:
        tmp = Path(name)
        base = floor(tmp, args.world_size, env)
        rows = scenarios(tmp, args.world_size)
    for fault, row in rows.items():
        mttr = row["mttr_s"]
        row["vs_floor"] = round(mttr / base, 2) if isinstance(mttr, (int, float)) else None
        if fault == "hang":
            bound = 3 * row["median_step_s"] + base
            row["target"] = f"detected <= {bound:.1f} s"
            row["within_target"] = row["detect_s"] is not None and row["detect_s"] <= bound
        else:
            row["target"] = "MTTR <= 2x floor"
            row["within_target"] = row["vs_floor"] is not None and row["vs_floor"] <= 2.0
    result = {
        "benchmark": "recovery",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "world_size": args.world_size,
        "floor": {"name": "start workers + import torch + join + load checkpoint", "seconds": base},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    table = Table(title=f"recovery on {args.world_size} ranks (floor {base:.1f} s)")
    for column in ("fault", "status", "MTTR s", "x floor", "steps", "detected after s", "target"):
        table.add_column(column, justify="left" if column in ("fault", "target") else "right")
    for fault, row in rows.items():
        mark = "ok" if row["within_target"] else "MISSED"
        cells = [row[k] for k in ("status", "mttr_s", "vs_floor", "mttr_steps", "detect_s")]
        table.add_row(fault, *map(str, cells), f"{row['target']} {mark}")
    Console().print(table)
    print(f"wrote {args.out}")
    return 0 if all(r["status"] == "passed" for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
