"""What `tightrope watch` costs per refresh (docs/watch.md).

A synthetic run of 2 ranks, each with a 10,000-step journal (step events, a layer_stats
event every 50 steps) and a microscope of 12 layers recorded every 10 steps. Timed in this
process, one CPU thread:

1. the first refresh, which reads the whole journal and the microscope;
2. a refresh after one more step on each rank (the steady state: only the new lines);
   and one after 100 more steps on each rank (a second of a fast job);
3. a refresh after a new microscope chunk appeared (the microscope is read again);
4. rendering one frame to text.

Each figure is the median over repeats; the JSON goes to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from harness.live.watch_reader import WatchReader  # noqa: E402
from harness.live.watch_view import render  # noqa: E402
from harness.records.journal import JournalWriter  # noqa: E402
from harness.records.microscope_file import (  # noqa: E402
    WHY_PERIODIC,
    MicroscopeWriter,
    Record,
    histogram,
)

LAYERS = [f"blocks.{i}.{part}" for i in range(6) for part in ("attn", "mlp")]


def _step(w: JournalWriter, step: int) -> None:
    w.emit("step", step, loss=3.0, lr=3e-4, loss_scale=65536.0, grad_norm=1.0, step_time=0.02)


def build(run_dir: Path, steps: int) -> tuple[list[JournalWriter], list[MicroscopeWriter]]:
    """The synthetic run; its writers stay open for the steps appended later."""
    writers = [JournalWriter(run_dir, rank=r) for r in (0, 1)]
    scopes = [
        MicroscopeWriter(run_dir, rank=r, restart=0, layers=LAYERS, chunk_records=50)
        for r in (0, 1)
    ]
    hist = np.stack([histogram(np.random.default_rng(0).normal(size=256)) for _ in LAYERS])
    for w in writers:
        w.emit("run_start", 0, world_size=2, pid=os.getpid(), host="here")
    for step in range(1, steps + 1):
        for w, scope in zip(writers, scopes, strict=True):
            _step(w, step)
            if step % 50 == 0:
                w.emit("layer_stats", step, layers={n: {"grad_norm": 1.0} for n in LAYERS})
            if step % 10 == 0:
                scope.add(_record(step, hist))
    for scope in scopes:
        scope.flush()
    return writers, scopes


def _record(step: int, hist: np.ndarray) -> Record:
    ones = np.ones(len(LAYERS), dtype=np.float32)
    return Record(step, WHY_PERIODIC, time.time(), ones, ones, ones * 1e-3, hist)


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> int:
    """Run the measurements; print them and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/watch.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        writers, scopes = build(run_dir, args.steps)
        journal_bytes = sum(p.stat().st_size for p in (run_dir / "journal").iterdir())
        reader = WatchReader(run_dir)
        first = _timed(reader.refresh)
        step = args.steps
        steady = []
        for _ in range(args.repeats):
            step += 1
            for w in writers:
                _step(w, step)
            steady.append(_timed(reader.refresh))
        idle = [_timed(reader.refresh) for _ in range(args.repeats)]
        burst = []  # a refresh after a second of a fast job: 100 steps on each rank
        for _ in range(10):
            for _ in range(100):
                step += 1
                for w in writers:
                    _step(w, step)
            burst.append(_timed(reader.refresh))
        new_chunk = []
        hist = np.stack([histogram(np.ones(4)) for _ in LAYERS])
        for _ in range(5):
            step += 1
            scopes[0].add(_record(step, hist))
            scopes[0].flush()
            time.sleep(max(0.0, reader.microscope_due - time.monotonic()))  # not held back
            before = reader.microscope
            new_chunk.append(_timed(reader.refresh))
            assert reader.microscope is not before, "the new chunk was not read"
        snapshot = reader.refresh()
        last = snapshot.ranks[0].last_step
        assert last is not None and last.step == step - 5, "the refreshes missed steps"
        assert snapshot.microscope is not None and len(snapshot.microscope.ranks[0]) > 0
        console = Console(file=io.StringIO(), width=120)
        frame = [_timed(lambda: console.print(render(snapshot))) for _ in range(20)]
        for w in writers:
            w.close()
    result = {
        "steps_per_rank": args.steps,
        "ranks": 2,
        "journal_bytes": journal_bytes,
        "first_refresh_ms": first * 1e3,
        "refresh_after_one_step_ms": statistics.median(steady) * 1e3,
        "refresh_nothing_new_ms": statistics.median(idle) * 1e3,
        "refresh_after_100_steps_ms": statistics.median(burst) * 1e3,
        "refresh_new_chunk_ms": statistics.median(new_chunk) * 1e3,
        "render_frame_ms": statistics.median(frame) * 1e3,
    }
    for name, value in result.items():
        print(f"{name:<28} {value:,.2f}" if isinstance(value, float) else f"{name:<28} {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
