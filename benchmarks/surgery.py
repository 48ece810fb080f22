"""Gradient surgery against skipping and rollback, on the same faults.

Each fault runs twice on the tiny preset (60 steps, checkpoints every 10): with every
mechanism on, and with ``surgery`` off (the step is skipped, and three skips in a row roll
back). The baseline is the fault-free run in the same command. Per run: whether it
completed, the steps lost (skipped updates, plus steps trained again after a rollback,
plus steps never reached when the run gave up) and the final loss (mean of the last 5
steps) against the baseline's.

    .venv/bin/python benchmarks/surgery.py [--steps 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.stability_support import claims, config, final_loss, run  # noqa: E402

AT = 20
FAULTS: dict[str, list[dict[str, Any]]] = {
    "nan_grad once, one block": [{"kind": "nan_grad", "target": "blocks.1.*", "at_step": AT}],
    "nan_grad 5 steps, one block": [
        {"kind": "nan_grad", "target": "blocks.1.*", "at_step": AT, "duration": 5}
    ],
    "inf_grad for good, one attention": [
        {"kind": "inf_grad", "target": "blocks.1.attn.*", "at_step": AT, "every": 1}
    ],
    "gradient bitflip": [
        {
            "kind": "bitflip",
            "tensor": "gradients",
            "target": "blocks.1.attn.qkv.weight",
            "bit": 30,
            "count": 4,
            "at_step": AT,
        }
    ],
    "weight bitflip": [
        {
            "kind": "bitflip",
            "tensor": "weights",
            "target": "blocks.1.mlp.fc.weight",
            "bit": 30,
            "count": 2,
            "at_step": AT,
        }
    ],
    "lr_spike x100": [{"kind": "lr_spike", "factor": 100.0, "at_step": AT}],
    "bad_batch": [{"kind": "bad_batch", "fraction": 1.0, "at_step": AT}],
}


def measure(
    folder: Path, steps: int, faults: list[dict[str, Any]], surgery: bool
) -> dict[str, Any]:
    """One run: status, steps lost, final loss, what acted."""
    cfg = config(steps=steps, disable=() if surgery else ("surgery",))
    result, journal = run(folder, cfg, faults)
    events = journal.of_kind("step")
    distinct = {e.step for e in events}
    lost = sum(1 for e in events if e.get("skipped")) + len(events) - len(distinct)
    lost += steps - max(distinct, default=0)
    acted = sorted({c["action"] for c in claims(journal, "recovered")})
    return {"status": result.status, "lost": lost, "final": final_loss(journal), "acted": acted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/surgery.json")
    args = parser.parse_args()
    if args.steps <= AT + 10:
        parser.error(f"--steps must be > {AT + 10}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="surgery-bench-"))
    try:
        _, clean = run(work / "clean", config(steps=args.steps))
        baseline = final_loss(clean)
        rows = []
        jobs = [(name, surgery) for name in FAULTS for surgery in (True, False)]
        for i, (name, surgery) in enumerate(track(jobs, description="runs")):
            got = measure(work / f"run-{i}", args.steps, FAULTS[name], surgery)
            rows.append({"fault": name, "surgery": surgery, **got,
                         "vs_baseline": got["final"] / baseline - 1})  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "steps": args.steps,
        "baseline_final": baseline,
        "rows": rows,
        "seconds": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = Table(title=f"surgery vs skip/rollback, tiny, {args.steps} steps, fault at {AT}")
    for column in ("fault", "surgery", "status", "steps lost", "final loss vs baseline", "acted"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["fault"], "on" if r["surgery"] else "off", r["status"], str(r["lost"]),
                      f"{r['vs_baseline']:+.2%}", ", ".join(r["acted"]))  # fmt: skip
    console = Console()
    console.print(table)
    console.print(f"baseline final loss {baseline:.4f}; {report['seconds']} s; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
