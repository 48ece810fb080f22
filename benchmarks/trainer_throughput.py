"""Reference-trainer throughput: tokens/s and step time per preset, precision and rank count.

Every configuration is trained through the real command line (``python -m reference_trainer``,
or ``torchrun --nproc-per-node 2`` for 2 ranks) in a fresh temporary run dir, with
``OMP_NUM_THREADS=1`` and no checkpoint before the last step. Step times come from the run's
journal: the median ``step_time`` over all ranks, skipping each rank's first warm-up steps.
``tokens/s`` is tokens per optimizer step (all ranks) divided by that median.

How to read it: absolute numbers depend on the machine and on whatever else it is doing, so
speed is given as ratios measured in the same command. ``x base`` is a row's tokens/s over the
baseline's (``tiny fp32 1 rank``); ``x 1 rank`` (DDP rows) is tokens/s on 2 ranks over the same
preset and precision on 1 rank: the scaling efficiency, ideally 2.0 with 2 ranks on 2 cores.
``wall s`` is the whole process (start-up, tokenizer training, final checkpoint), not a speed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from harness.errors import JournalError
from harness.records.journal import read_journal

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path("benchmarks/results/trainer_throughput.json")
BASELINE = "tiny fp32 1 rank"
RUN_TIMEOUT_S = 900


@dataclass(slots=True)
class Config:
    """One run to measure: what to train and for how many steps."""

    preset: str
    precision: str
    ranks: int
    steps: int
    warmup: int
    """Leading steps of each rank left out of the median."""

    @property
    def name(self) -> str:
        """Row name, e.g. ``small bf16 1 rank``."""
        return f"{self.preset} {self.precision} {self.ranks} rank{'s' if self.ranks > 1 else ''}"


# Sized for ~6 minutes on a 2-core CPU. small bf16/fp16 take ~25 s a step there (no fast
# low-precision CPU kernels), so they skip only 1 warm-up step: no warm-up effect shows at that
# scale, and 3 would cost another minute each.
FULL = (
    Config("tiny", "fp32", 1, 40, 3),
    Config("tiny", "bf16", 1, 12, 3),
    Config("tiny", "fp16", 1, 12, 3),
    Config("small", "fp32", 1, 15, 3),
    Config("small", "bf16", 1, 4, 1),
    Config("small", "fp16", 1, 4, 1),
    Config("tiny", "fp32", 2, 40, 3),
    Config("small", "fp32", 2, 15, 3),
)
#: --quick: the tiny runs, with a quarter fewer steps.
QUICK = tuple(replace(c, steps=c.steps * 3 // 4) for c in FULL if c.preset == "tiny")


@dataclass(slots=True)
class Row(Config):
    """A configuration and what its run measured (the speeds stay None when it failed)."""

    ok: bool = False
    wall_s: float = 0.0
    step_samples: int = 0
    """Step times the median is taken over: (steps - warmup) x ranks."""
    tokens_per_step: int | None = None
    median_step_s: float | None = None
    min_step_s: float | None = None
    max_step_s: float | None = None
    tokens_per_s: float | None = None
    x_baseline: float | None = None
    x_one_rank: float | None = None
    error: str | None = None


def command(cfg: Config, run_dir: Path) -> list[str]:
    """The trainer command line of ``cfg`` (under torchrun when it has several ranks)."""
    launch = [sys.executable, "-m", "reference_trainer"]
    if cfg.ranks > 1:  # `python -m torch.distributed.run` is what the `torchrun` script runs
        torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.ranks}"]
        launch = [sys.executable, *torchrun, *launch[1:]]
    return [
        *launch,
        *("--preset", cfg.preset, "--precision", cfg.precision, "--steps", str(cfg.steps)),
        *("--run-dir", str(run_dir), "--log-every", str(cfg.steps)),
        *("--checkpoint-every", str(cfg.steps + 1)),
    ]


def error_tail(text: str) -> str:
    """The last lines the trainer wrote, before torchrun's own report (kept to its verdict)."""
    lines = text.strip().splitlines()
    cut = next((i for i, x in enumerate(lines) if "torch/distributed/elastic" in x), len(lines))
    verdict = [x.split("] ", 1)[-1] for x in lines[cut:] if "failed (exitcode" in x]
    return "\n".join([*(lines[:cut] or lines)[-15:], *(f"torchrun: {v}" for v in verdict)])


def measure(cfg: Config, run_dir: Path) -> Row:
    """Train ``cfg`` in ``run_dir`` as a subprocess and read its speed from the journal."""
    row = Row(**asdict(cfg))
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        command(cfg, run_dir),
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun passes it on to its ranks (each in its own session)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        row.error = f"stopped after the {RUN_TIMEOUT_S} s time limit; "
    row.wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        why = f"exit code {proc.returncode}; stderr ends:\n{error_tail(err or out)}"
        row.error = (row.error or "") + why
        return row
    try:
        steps = read_journal(run_dir).of_kind("step")
    except JournalError as exc:
        row.error = f"exit code 0 but no readable journal: {exc}"
        return row
    times = [e["step_time"] for e in steps if e.step > cfg.warmup]
    if len(steps) != cfg.steps * cfg.ranks or not times:
        row.error = f"journal has {len(steps)} step events, expected {cfg.steps * cfg.ranks}"
        return row
    row.ok, row.step_samples = True, len(times)
    row.tokens_per_step = int(steps[0]["tokens"])
    row.median_step_s = statistics.median(times)
    row.min_step_s, row.max_step_s = min(times), max(times)
    row.tokens_per_s = row.tokens_per_step / row.median_step_s
    return row


def add_ratios(rows: list[Row]) -> None:
    """Fill in each row's tokens/s ratio to the baseline and (DDP rows) to its 1-rank row."""
    speed = {r.name: r.tokens_per_s for r in rows if r.tokens_per_s}
    for r in rows:
        if r.tokens_per_s is None:
            continue
        if base := speed.get(BASELINE):
            r.x_baseline = r.tokens_per_s / base
        if r.ranks > 1 and (one := speed.get(Config(r.preset, r.precision, 1, 0, 0).name)):
            r.x_one_rank = r.tokens_per_s / one


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or a dash when missing."""
    return "-" if value is None else format(value, spec)


def table(rows: list[Row]) -> Table:
    """The rows as a table (Markdown-style, so it pastes into the README)."""
    t = Table(box=box.MARKDOWN)
    for head in ("run", "steps", "median ms/step", "tokens/s", "x base", "x 1 rank", "wall s"):
        t.add_column(head, justify="left" if head == "run" else "right")
    for r in rows:
        t.add_row(
            r.name if r.ok else f"{r.name} (FAILED)",
            f"{r.warmup}+{r.steps - r.warmup}",
            fmt(r.median_step_s and r.median_step_s * 1e3, ",.1f"),
            fmt(r.tokens_per_s, ",.0f"),
            fmt(r.x_baseline, ".3f"),
            fmt(r.x_one_rank, ".2f"),
            fmt(r.wall_s, ".1f"),
        )
    return t


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    runs = "\n".join(f"  {c.name:<18} {c.steps:>3} steps, {c.warmup} warm-up" for c in FULL)
    p = argparse.ArgumentParser(
        description=__doc__,
        epilog=f"full runs (--quick: the tiny ones, a quarter fewer steps):\n{runs}\n\n"
        "Exit code 1 if any run failed (its stderr tail is printed), after writing the rest.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="only tiny (fp32, bf16, fp16; fp32 on 2 ranks), fewer steps: ~1 min, not ~6",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"JSON file of rows and metadata; its folder is created (default: {DEFAULT_OUT}, "
        "under the repository root)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run every configuration, print the table, write the JSON; 1 if any run failed."""
    args = parse_args(argv)
    out: Path = args.out if args.out != DEFAULT_OUT else REPO / DEFAULT_OUT
    configs = QUICK if args.quick else FULL
    started, load_start = time.perf_counter(), os.getloadavg()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tightrope-bench-") as tmp:
        for i, cfg in enumerate(configs, 1):
            print(f"[{i}/{len(configs)}] {cfg.name} ({cfg.steps} steps) ...", end=" ", flush=True)
            row = measure(cfg, Path(tmp) / f"run-{i}")
            rows.append(row)
            if row.ok and row.median_step_s and row.tokens_per_s:
                speed = f"{row.median_step_s * 1e3:,.1f} ms/step, {row.tokens_per_s:,.0f} tokens/s"
                print(f"{speed}, {row.wall_s:.1f} s wall", flush=True)
            else:
                print(f"FAILED after {row.wall_s:.1f} s\n{row.error}", flush=True)
    add_ratios(rows)
    total = time.perf_counter() - started
    failed = [r.name for r in rows if not r.ok]
    meta: dict[str, Any] = {
        "benchmark": "trainer_throughput",
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "quick": args.quick,
        "baseline": BASELINE,
        "torch": version("torch"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "omp_num_threads": 1,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "total_wall_s": round(total, 1),
        "failed": failed,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({**meta, "rows": [{"name": r.name, **asdict(r)} for r in rows]}, indent=2) + "\n"
    )
    print(f"\nsteps: warm-up+measured; x base: tokens/s over {BASELINE}'s;")
    print("x 1 rank: tokens/s over the same preset and precision on 1 rank (ideal 2.0)\n")
    Console(width=120, highlight=False).print(table(rows))
    print(f"\ntotal {total:.0f} s; wrote {out}")
    if load_start[0] > (os.cpu_count() or 2) / 2:  # before any run of ours: someone else's
        print(
            f"warning: load average {load_start[0]:.1f} on {os.cpu_count()} CPUs before the "
            "first run: other processes compete, so numbers (ratios too) are unreliable",
            file=sys.stderr,
        )
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
