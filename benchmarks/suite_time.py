"""Suite wall time: how long `tightrope run` takes for the smoke and core suites.

Each suite runs through the real command line (``tightrope run SUITE``) with an empty
baseline cache, so the fault-free baselines are part of the time ("cold"), and then
again with the cache it filled ("warm", what a second CI run on unchanged code pays).
The named baseline, run in the same command, is one bare ``python -m reference_trainer``
run of the tiny preset for 40 steps with no harness around it: the ratio says how many
such runs a suite costs. Targets on a 2-core machine: smoke <= 60 s, core <= 5 min (cold).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"smoke": 60.0, "core": 300.0}


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Wall seconds, exit code and the tail of the output of one command."""
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    return time.monotonic() - started, proc.returncode, (proc.stdout + proc.stderr)[-1500:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", nargs="+", default=["smoke", "core"], choices=TARGETS)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/suite_time.json")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    tightrope = [sys.executable, "-m", "harness"]
    rows: list[dict[str, Any]] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        bare = [sys.executable, "-m", "reference_trainer", "--preset", "tiny", "--steps", "40",
                "--run-dir", f"{tmp}/bare", "--log-every", "40"]  # fmt: skip
        base_s, code, tail = timed(bare, env)
        if code:
            sys.exit(f"the baseline run failed ({code}):\n{tail}")
        for suite in args.suites:
            for phase in ("cold", "warm"):
                cache = f"{tmp}/cache-{suite}"
                cmd = [*tightrope, "run", f"scenarios/{suite}.yaml",
                       "--scorecard", f"{tmp}/{suite}-{phase}"]  # fmt: skip
                seconds, code, tail = timed(cmd, env | {"TIGHTROPE_CACHE": cache})
                card = json.loads(Path(f"{tmp}/{suite}-{phase}/scorecard.json").read_text())
                failed |= code != 0
                rows.append({
                    "suite": suite, "phase": phase, "seconds": round(seconds, 1),
                    "scenarios": len(card["scenarios"]), "score": card["score"],
                    "exit_code": code, "vs_bare_run": round(seconds / base_s, 2),
                    "target_s": TARGETS[suite] if phase == "cold" else None,
                    "within_target": seconds <= TARGETS[suite] if phase == "cold" else None,
                })  # fmt: skip
                if code:
                    print(f"{suite} ({phase}) exited {code}:\n{tail}", file=sys.stderr)
    result = {
        "benchmark": "suite_time",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "baseline": {"name": "bare tiny run, 40 steps, 1 rank", "seconds": round(base_s, 2)},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    table = Table(title=f"suite wall time (baseline: bare tiny run, {base_s:.1f} s)")
    for column in ("suite", "phase", "scenarios", "score", "seconds", "x bare run", "target"):
        table.add_column(column, justify="left" if column in ("suite", "phase") else "right")
    for r in rows:
        target = "" if r["target_s"] is None else (
            f"<= {r['target_s']:.0f} s " + ("ok" if r["within_target"] else "MISSED"))  # fmt: skip
        table.add_row(r["suite"], r["phase"], str(r["scenarios"]), f"{r['score']:.1f}",
                      f"{r['seconds']:.1f}", f"{r['vs_bare_run']:.1f}", target)  # fmt: skip
    Console().print(table)
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
