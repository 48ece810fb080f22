"""Metrics overhead: what the agent's metrics for dashboards (docs/metrics.md) cost a step.

1. The reference trainer (tiny, fp32, 1 rank, one CPU thread) trained through its command
   line with metrics off (the baseline) and with the OpenMetrics file on (every 5 s, the
   default, and every step: the worst case the interval prevents), taking turns in rounds;
   the median ``step_time`` of each run's journal (first steps skipped), over rounds.
2. One journal write (``emit`` of a step event) bare and with metrics counting it, timed
   over many writes in this process: the cost the metrics add to every event.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.inside.metrics import MeteredJournal, Metrics, MetricsOptions  # noqa: E402
from harness.records.journal import JournalWriter, read_journal  # noqa: E402

WARMUP = 5
VARIANTS = {"off": {}, "file every 5 s": {"TIGHTROPE_METRICS_FILE": "1"}}
VARIANTS["file every step"] = {"TIGHTROPE_METRICS_FILE": "1", "TIGHTROPE_METRICS_INTERVAL": "1e-9"}


def train(steps: int, env: dict[str, str]) -> float:
    """Median seconds per step of one tiny run with ``env`` added."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        argv = [sys.executable, "-m", "reference_trainer", "--preset", "tiny"]
        argv += ["--steps", str(steps), "--checkpoint-every", str(steps), "--run-dir", str(run_dir)]
        full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
        subprocess.run(argv, cwd=ROOT, env=full, check=True, capture_output=True)
        # Between consecutive step events (the journal's monotonic clock): the whole loop,
        # the journal write and any metrics write in it, which `step_time` leaves out.
        monos = [e.mono for e in read_journal(run_dir).of_kind("step")][WARMUP:]
        return statistics.median([b - a for a, b in itertools.pairwise(monos)])


def emit_cost(count: int) -> dict[str, float]:
    """Microseconds per step-event write, bare and with metrics (file every 5 s)."""
    out: dict[str, float] = {}
    for name in ("bare", "with metrics"):
        runs = []
        for _ in range(5):
            with tempfile.TemporaryDirectory() as tmp:
                d = Path(tmp)
                if name == "bare":
                    writer = JournalWriter(d, rank=0)
                else:
                    metrics = Metrics(MetricsOptions(file=d / "m.prom", interval=5.0), 0)
                    writer = MeteredJournal(d, 0, 0, metrics)
                start = time.perf_counter()
                for step in range(1, count + 1):
                    writer.emit("step", step, loss=1.0 / step, loss_scale=1024.0, tokens=512)
                runs.append((time.perf_counter() - start) / count * 1e6)
                writer.close()
        out[name] = statistics.median(runs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="steps per run (100)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the variants (3)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/metrics.json")
    args = parser.parse_args()
    per: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        names = list(VARIANTS)
        names = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
        for name in names:
            per[name].append(train(args.steps, VARIANTS[name]))
    base = statistics.median(per["off"])
    rows = []
    print(f"{'variant':<18} {'ms/step':>8} {'x off':>6}   (median over {args.rounds} rounds)")
    for name, values in per.items():
        ms = statistics.median(values) * 1e3
        rows.append({"variant": name, "ms_per_step": ms, "x_off": ms / (base * 1e3)})
        print(f"{name:<18} {ms:8.2f} {ms / (base * 1e3):6.3f}")
    emits = emit_cost(5000)
    print(f"emit: {emits['bare']:.1f} us bare, {emits['with metrics']:.1f} us with metrics")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"steps": args.steps, "rounds": args.rounds, "runs": per, "rows": rows}
    report["emit_us"] = emits
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
