"""How often the problem-layer diagnosis names the block a fault was aimed at.

For each fault a layer applies to (`tests/diagnosis_trials.FAULTS`: NaN and infinite
gradients, a flipped weight bit, a flipped gradient bit, an activation overflow in fp32
and in fp16), aimed at each block of a 4-block tiny model with several seeds, the first
`diagnosed` event after the fault must name that block first. Reported per fault: hits,
trials, the rate, and the rules that named it; undetected faults (no diagnosis at all)
count as misses. The baseline, run in the same command, is one trial per fault with
`layer_stats` off: it must name nothing.

    .venv/bin/python benchmarks/diagnosis.py [--seeds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import track
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.diagnosis_trials import BLOCKS, FAULTS, trial  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2, help="seeds per fault and block")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/diagnosis.json")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.monotonic()
    jobs = [(f, b, s) for f in FAULTS for b in range(BLOCKS) for s in range(args.seeds)]
    results = [trial(f, b, seed=100 * s + b) for f, b, s in track(jobs, description="trials")]
    baseline = [trial(f, 1, seed=1, disable=("layer_stats",)) for f in FAULTS]
    rows = []
    for fault in FAULTS:
        mine = [t for t in results if t.fault == fault]
        hits = sum(t.hit for t in mine)
        rules = collections.Counter(t.rule for t in mine if t.hit)
        rows.append({"fault": fault, "hits": hits, "trials": len(mine),
                     "rate": hits / len(mine), "rules": dict(rules),
                     "misses": [{"block": t.block, "seed": t.seed, "named": t.named,
                                 "rule": t.rule} for t in mine if not t.hit]})  # fmt: skip
    hits, total = sum(r["hits"] for r in rows), sum(r["trials"] for r in rows)
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "seeds": args.seeds,
        "blocks": BLOCKS,
        "rows": rows,
        "hits": hits,
        "trials": total,
        "rate": hits / total,
        "baseline_named": sum(bool(t.named) for t in baseline),
        "baseline_trials": len(baseline),
        "seconds": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = Table(title=f"problem-layer diagnosis, {BLOCKS} blocks x {args.seeds} seeds")
    for column in ("fault", "named the block", "rate", "rules"):
        table.add_column(column)
    for r in rows:
        rules = ", ".join(f"{k} {v}" for k, v in r["rules"].items())
        table.add_row(r["fault"], f"{r['hits']}/{r['trials']}", f"{r['rate']:.0%}", rules)
    table.add_row("all", f"{hits}/{total}", f"{hits / total:.0%}", "")
    console = Console()
    console.print(table)
    console.print(
        f"baseline (layer_stats off): named a layer in {report['baseline_named']} of "
        f"{len(baseline)} trials; {report['seconds']} s; JSON: {args.out}"
    )
    return 0 if report["baseline_named"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
