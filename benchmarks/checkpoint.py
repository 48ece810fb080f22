"""Checkpoint cost: save time, bytes on disk, restore time and the training-loop stall per
save, for full and delta checkpoints, each against plain ``torch.save`` of the same state.

One real run of the reference trainer (``python -m reference_trainer``, fp32, one rank)
writes its checkpoints as it always does: every ``full_every``-th one full, the rest deltas,
persisted in a background thread. Its journal gives, per save, the stall (the seconds the
loop waited: copying the state to memory and writing the RNG file), the persist time and
the bytes. Then, in this process, every checkpoint is restored (verified against its
manifest) and, as the named baseline, the same restored state is written with plain
``torch.save`` and read back with ``torch.load``: ratios are ours over the baseline's.

How to read it: ``stall % step`` is one save's stall over the median step time;
``stall % at interval`` spreads it over the default interval of the preset (the target is
<= 3.5% on ``small``); the deltas' bytes are summed over the series and divided by the
baseline's bytes for the same states (target <= 0.8). ``bit-exact`` says the restored state
matched, tensor for tensor, what was saved (the manifest's hashes of the in-memory state).
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

import torch
from rich.console import Console
from rich.table import Table

from harness.records.journal import read_journal
from reference_trainer.checkpoints.manager import CheckpointConfig, CheckpointManager
from reference_trainer.checkpoints.manifest import describe_tensors, read_manifest
from reference_trainer.config import preset

ROOT = Path(__file__).resolve().parent.parent
#: (ours, baseline) keys of a checkpoint row that make a ratio.
PAIRS = (("bytes", "base_bytes"), ("save_s", "base_save_s"), ("restore_s", "base_load_s"))


def train(run_dir: Path, name: str, steps: int, every: int) -> None:
    """One real training run with checkpoints every ``every`` steps."""
    cmd = [sys.executable, "-m", "reference_trainer", "--preset", name, "--steps", str(steps),
           "--checkpoint-every", str(every), "--keep-checkpoints", "1000",
           "--log-every", str(steps), "--run-dir", str(run_dir)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"training failed ({proc.returncode}):\n{proc.stderr[-2000:]}")


def baseline(state: dict[str, Any], path: Path) -> tuple[int, float, float]:
    """Bytes, save seconds and load seconds of plain ``torch.save`` to a file (fsynced, as
    ours are) and ``torch.load`` of it."""
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    saved = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.load(path, weights_only=True)
    loaded = time.perf_counter() - t0
    size = path.stat().st_size
    path.unlink()
    return size, saved, loaded


def measure(name: str, steps: int, every: int) -> dict[str, Any]:
    """Run, restore every checkpoint, compare with the baseline; one row per checkpoint."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        print(f"training {name} for {steps} steps, a checkpoint every {every} ...", flush=True)
        train(run_dir, name, steps, every)
        journal = read_journal(run_dir)
        step_time = statistics.median(e["step_time"] for e in journal.of_kind("step")[3:])
        manager = CheckpointManager(
            run_dir, CheckpointConfig(), rank=0, keep=1000, barrier=lambda: None,
            claim=lambda *a, **k: None,
        )  # fmt: skip
        rows = []
        for event in journal.of_kind("checkpoint_saved"):
            path = Path(event["path"])
            t0 = time.perf_counter()
            state = manager.load(path)  # verified: raises on any mismatch
            restore = time.perf_counter() - t0
            exact = describe_tensors(state) == read_manifest(path)["tensors"]
            base_bytes, base_save, base_load = baseline(state, Path(tmp) / "plain.pt")
            rows.append({
                "step": event.step, "type": event["type"], "bytes": event["bytes"],
                "save_s": event["seconds"], "stall_s": event["stall_seconds"],
                "restore_s": restore, "bit_exact": exact, "base_bytes": base_bytes,
                "base_save_s": base_save, "base_load_s": base_load,
            })  # fmt: skip
    default_interval = preset(name).checkpoint_every
    deltas = [r for r in rows if r["type"] == "delta"]
    fulls = [r for r in rows if r["type"] == "full"]

    def ratio(key: str, base: str, group: list[dict[str, Any]]) -> float | None:
        return sum(r[key] for r in group) / sum(r[base] for r in group) if group else None

    stall = statistics.median(r["stall_s"] for r in rows)
    return {
        "preset": name,
        "steps": steps,
        "interval": every,
        "default_interval": default_interval,
        "median_step_s": step_time,
        "median_stall_s": stall,
        "stall_pct_of_step": 100 * stall / step_time,
        "stall_pct_at_default_interval": 100 * stall / (step_time * default_interval),
        "full": {k: ratio(k, b, fulls) for k, b in PAIRS},
        "delta": {k: ratio(k, b, deltas) for k, b in PAIRS},
        "bit_exact": all(r["bit_exact"] for r in rows),
        "checkpoints": rows,
    }  # fmt: skip


def show(result: dict[str, Any]) -> None:
    """Print the summary table."""
    table = Table(title=f"checkpoints of '{result['preset']}' vs plain torch.save (= 1.00)")
    for column in ("", "bytes", "save time", "restore time"):
        table.add_column(column, justify="right")
    for kind in ("full", "delta"):
        r = result[kind]
        cells = [
            f"{r[k]:.2f}x" if r[k] is not None else "-" for k in ("bytes", "save_s", "restore_s")
        ]
        table.add_row(kind, *cells)
    Console().print(table)
    print(
        f"stall per save: {result['median_stall_s'] * 1e3:.1f} ms = "
        f"{result['stall_pct_of_step']:.1f}% of a {result['median_step_s'] * 1e3:.0f} ms step, "
        f"{result['stall_pct_at_default_interval']:.2f}% at the default interval of "
        f"{result['default_interval']} steps (target <= 3.5%)"
    )
    print(f"restores bit-exact: {result['bit_exact']}")


def main() -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", help="preset to train (default: small)")
    parser.add_argument("--steps", type=int, default=120, help="steps to train (default: 120)")
    parser.add_argument("--every", type=int, default=15, help="steps between checkpoints")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/checkpoint.json")
    args = parser.parse_args()
    result = measure(args.preset, args.steps, args.every)
    result["measured_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    result["baseline"] = "torch.save / torch.load of the same state, same process"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    show(result)
    print(f"written to {args.out}")
    return 0 if result["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
