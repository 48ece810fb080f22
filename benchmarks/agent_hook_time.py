"""What the zero-code attach costs a framework trainer's step, timed inside its process.

The CPU time spent in tightrope's agent per step, over the step's own CPU time.

Section 4 of ``agent_overhead.py`` compares whole runs, bare and under ``tightrope exec``;
single runs differ from each other by several percent, more than the 2% it has to resolve.
This times the agent where it runs: each framework script of ``benchmarks/frameworks/``
(it knows nothing of tightrope) runs once under ``python -m harness exec``, disarmed and
with ``TIGHTROPE_MICROSCOPE=on``, with ``benchmarks/frameworks/hook_clock`` first on its
path: its ``sitecustomize`` adds up this thread's CPU time inside each of the agent's entry
points from the trainer (and the microscope's output hook), after the warm-up. The figure
is ``1 + agent time per step / the step's median CPU time`` (the same run's, taken by the
script). The clock's own reads (two per call, about 12 calls a step) are in the agent's
time, so the figures lean high. Targets: disarmed <= 1.02x, microscope <= 1.05x.

    .venv/bin/python benchmarks/agent_hook_time.py [--size tiny --size small]   # ~4 min
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
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
CLOCK = ROOT / "benchmarks/frameworks/hook_clock"
SCRIPTS = {
    "transformers": ROOT / "benchmarks/frameworks/hf_gpt2.py",
    "lightning": ROOT / "benchmarks/frameworks/lightning_gpt2.py",
}
VARIANTS = {"disarmed": "off", "microscope": "on"}
TARGETS = {"disarmed": 1.02, "microscope": 1.05}
#: Steps per run by size: the small model's steps are ~9x longer.
STEPS = {"tiny": 400, "small": 110}
WARMUP = 10
DEFAULT_OUT = ROOT / "benchmarks/results/agent_hook_time.json"


def run_once(framework: str, size: str, variant: str, tmp: Path) -> dict[str, Any]:
    """One exec run; its step CPU median, the agent's seconds per entry point and steps."""
    where = tmp / f"{framework}-{size}-{variant}"
    where.mkdir(parents=True)
    clock, steps_file = where / "clock.jsonl", where / "steps.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIGHTROPE_")}
    path = os.pathsep.join([str(CLOCK), str(ROOT), env.get("PYTHONPATH", "")])
    env.update(
        OMP_NUM_THREADS="1",
        TIGHTROPE_MICROSCOPE=VARIANTS[variant],
        PYTHONPATH=path,
        TIGHTROPE_HOOK_CLOCK=str(clock),
        TIGHTROPE_HOOK_CLOCK_WARMUP=str(WARMUP),
    )
    cmd = [sys.executable, "-m", "harness", "exec", "--run-dir", str(where / "run"), "--",
           sys.executable, str(SCRIPTS[framework]), "--steps", str(STEPS[size]),
           "--size", size, "--out", str(steps_file)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    if done.returncode or not clock.exists():
        raise SystemExit(f"{framework} {size} {variant}: exit {done.returncode}, no clock\n"
                         f"{done.stderr[-2000:]}")  # fmt: skip
    (line,) = clock.read_text().splitlines()  # one process trained
    timed = json.loads(line)
    made = json.loads(steps_file.read_text())
    step_cpu = statistics.median(made["cpu_s"][WARMUP:])
    agent = sum(timed["seconds"].values()) / timed["steps"]
    return {"framework": framework, "size": size, "variant": variant,
            "steps": timed["steps"], "step_cpu_ms": step_cpu * 1e3, "agent_ms": agent * 1e3,
            "by_entry_ms": {k: v / timed["steps"] * 1e3 for k, v in timed["seconds"].items()},
            "x": 1 + agent / step_cpu, "target": TARGETS[variant],
            "ok": 1 + agent / step_cpu <= TARGETS[variant]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run every framework x size x variant once, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", action="append", choices=sorted(STEPS),
                        help="model size (repeatable; default tiny and small)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    sizes = args.size or ["tiny", "small"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tightrope-hook-clock-") as tmp:
        for size in sizes:
            for framework in SCRIPTS:
                for variant in VARIANTS:
                    print(f"{framework} {size} {variant} ...", flush=True)
                    rows.append(run_once(framework, size, variant, Path(tmp)))
    table = Table(title="time inside tightrope's agent per step, tightrope exec (CPU, one thread)")
    for col in ("framework", "size", "variant", "step ms", "agent ms", "x step", "target", "ok"):
        table.add_column(
            col, justify="left" if col in ("framework", "size", "variant") else "right"
        )
    for r in rows:
        table.add_row(r["framework"], r["size"], r["variant"], f"{r['step_cpu_ms']:.1f}",
                      f"{r['agent_ms']:.3f}", f"{r['x']:.3f}", f"<= {r['target']:.2f}",
                      "ok" if r["ok"] else f"MISS by {r['x'] - r['target']:.3f}")  # fmt: skip
    Console(width=max(Console().width, 110)).print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "agent_hook_time",
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "baseline": "the same run's own step (median CPU time of a step, taken by the script)",
        "load_average": os.getloadavg(), "warmup": WARMUP, "rows": rows,
    }, indent=2) + "\n")  # fmt: skip
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
