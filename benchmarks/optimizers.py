"""Optimizer cost on 2 ranks: step time and all-reduce time of each optimizer vs AdamW.

Each optimizer trains the same preset for the same steps on 2 ranks under ``torchrun``
(DDP over gloo, ``OMP_NUM_THREADS=1``), in a fresh temporary run dir, with no checkpoint
before the last step; the optimizers take turns, ``--rounds`` times (every other round in
reverse order), so a change in the machine's load falls on each. This script is also the
worker torchrun starts (``--worker``): it builds the reference trainer's run as
``python -m reference_trainer`` would and registers a DDP communication hook before the
first backward pass. For each gradient bucket the hook waits at a barrier for the other
rank (timed as ``wait``), then all-reduces the bucket itself, synchronously, and times that
call (``all-reduce``): every byte DDP sends goes through it, the real gradients' and
(Sophia) the Hessian estimate's. (Done synchronously, the all-reduce no longer overlaps the
rest of backward; both optimizers are measured that way, so their ratio is like for like.)

Figures are over the measured steps (each rank's first warm-up steps left out), whose
count is a multiple of Sophia's k so they hold its Hessian steps in their true share:
``step ms`` is the mean step time of both ranks (the journal's ``step_time``, which holds the
Hessian pass), ``plain ms`` the same over the steps without an estimate, ``all-reduce ms``
and ``wait ms`` the mean time per step in the hook, ``MB`` the bytes all-reduced per step.
Each is the median over rounds; an ``x adamw`` column is the median over rounds of the
row's figure over AdamW's (its ``step ms`` for ``plain ms``) in the same round.
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
from collections import defaultdict
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from harness.optimizers import OPTIMIZERS

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path("benchmarks/results/optimizers.json")
BASELINE = "adamw"
DEFAULT_OPTIMIZERS = ("adamw", "sophia")
RANKS = 2
RUN_TIMEOUT_S = 900
COMM_FILE = "comm-rank{rank}.json"


@dataclass(slots=True)
class Row:
    """One optimizer's run and what it measured (None where the run failed)."""

    optimizer: str
    round: int = 0
    ok: bool = False
    wall_s: float = 0.0
    measured_steps: int = 0
    step_ms: float | None = None
    step_ms_median: float | None = None
    #: Mean step time of the steps with no Hessian estimate (all of AdamW's).
    plain_step_ms: float | None = None
    allreduce_ms: float | None = None
    wait_ms: float | None = None
    allreduce_mb: float | None = None
    allreduce_calls: float | None = None
    hessian_steps: int | None = None
    error: str | None = None


@dataclass(slots=True)
class Summary:
    """One optimizer over every round: medians, and medians of the ratios to AdamW."""

    optimizer: str
    rounds: int
    step_ms: float | None = None
    plain_step_ms: float | None = None
    allreduce_ms: float | None = None
    wait_ms: float | None = None
    allreduce_mb: float | None = None
    hessian_steps: int | None = None
    x_step: float | None = None
    x_plain_step: float | None = None
    x_allreduce: float | None = None
    x_wait: float | None = None
    x_bytes: float | None = None


# -- the worker, under torchrun -----------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    """Train one optimizer on this rank with the timing hook on DDP; write its figures."""
    import torch
    import torch.distributed as dist

    from faults import FaultPlan
    from reference_trainer.config import preset
    from reference_trainer.processes import distributed
    from reference_trainer.train import Run

    cfg = preset(args.preset)
    cfg.optim.name = args.optimizer
    cfg.steps, cfg.log_every, cfg.checkpoint_every = args.steps, args.steps, args.steps + 1
    run_dir = Path(args.run_dir)
    topo = distributed.init("cpu", None)
    try:
        run = Run(cfg, run_dir, topo, FaultPlan())
        # step -> [seconds, bytes, calls, seconds waiting] of DDP's all-reduces in that step
        comm: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])

        # (No annotations: DDP checks the hook's, and this module's are strings.)
        def timed_allreduce(state, bucket):  # type: ignore[no-untyped-def]
            buffer = bucket.buffer()
            t0 = time.perf_counter()
            dist.barrier()  # the other rank's lag, kept out of the transfer's time
            t1 = time.perf_counter()
            dist.all_reduce(buffer)
            seconds = time.perf_counter() - t1
            buffer.div_(topo.world_size)
            figures = comm[run.agent.step]
            figures[0] += seconds
            figures[1] += buffer.numel() * buffer.element_size()
            figures[2] += 1
            figures[3] += t1 - t0
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(buffer)
            return done

        run.trainer.wrapped.register_comm_hook(None, timed_allreduce)
        run.execute(False, cfg.steps)
        path = run_dir / COMM_FILE.format(rank=topo.rank)
        path.write_text(json.dumps({str(step): f for step, f in sorted(comm.items())}))
    finally:
        distributed.shutdown(topo)
    return 0


# -- the driver ---------------------------------------------------------------------------


def command(args: argparse.Namespace, optimizer: str, run_dir: Path) -> list[str]:
    """torchrun running this script's worker for ``optimizer``."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}"]
    return [
        sys.executable,
        *torchrun,
        str(Path(__file__).resolve()),
        *("--worker", "--optimizer", optimizer, "--run-dir", str(run_dir)),
        *("--preset", args.preset, "--steps", str(args.steps)),
    ]


def measure(args: argparse.Namespace, optimizer: str, run_dir: Path) -> Row:
    """Run ``optimizer`` on 2 ranks and read its figures from the journal and the hook's."""
    from harness.records.journal import read_journal

    row = Row(optimizer)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            command(args, optimizer, run_dir),
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        row.error = f"stopped after the {RUN_TIMEOUT_S} s time limit"
        return row
    row.wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        row.error = f"exit code {proc.returncode}; stderr ends:\n{tail}"
        return row
    measured = range(args.warmup + 1, args.steps + 1)
    steps = [e for e in read_journal(run_dir).of_kind("step") if e.step in measured]
    comm = [json.loads((run_dir / COMM_FILE.format(rank=r)).read_text()) for r in range(RANKS)]
    if len(steps) != len(measured) * RANKS:
        row.error = f"journal has {len(steps)} measured step events, expected {len(measured) * 2}"
        return row
    times = [e["step_time"] for e in steps]
    per_rank = [[c.get(str(s), [0.0] * 4) for s in measured] for c in comm]
    n = len(measured) * RANKS
    row.ok, row.measured_steps = True, len(measured)
    row.step_ms = 1e3 * statistics.fmean(times)
    row.step_ms_median = 1e3 * statistics.median(times)
    row.allreduce_ms = 1e3 * sum(f[0] for rank in per_rank for f in rank) / n
    row.wait_ms = 1e3 * sum(f[3] for rank in per_rank for f in rank) / n
    row.allreduce_mb = sum(f[1] for rank in per_rank for f in rank) / n / 1e6
    row.allreduce_calls = sum(f[2] for rank in per_rank for f in rank) / n
    estimated = set()
    if optimizer == "sophia":
        every = _hessian_every()
        estimated = {s for s in measured if (s - 1) % every == 0}
        row.hessian_steps = len(estimated)
    row.plain_step_ms = 1e3 * statistics.fmean(
        e["step_time"] for e in steps if e.step not in estimated
    )
    return row


def _hessian_every() -> int:
    from reference_trainer.config import OptimConfig

    return OptimConfig().sophia.hessian_every


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(rows: list[Row], optimizers: tuple[str, ...]) -> list[Summary]:
    """Per optimizer: the median over rounds of each figure and of its ratio to AdamW."""
    base = {r.round: r for r in rows if r.optimizer == BASELINE and r.ok}
    out = []
    for name in optimizers:
        mine = [r for r in rows if r.optimizer == name and r.ok]
        pairs = [(r, base[r.round]) for r in mine if r.round in base]
        out.append(
            Summary(
                optimizer=name,
                rounds=len(mine),
                step_ms=_median([r.step_ms for r in mine]),
                plain_step_ms=_median([r.plain_step_ms for r in mine]),
                allreduce_ms=_median([r.allreduce_ms for r in mine]),
                wait_ms=_median([r.wait_ms for r in mine]),
                allreduce_mb=_median([r.allreduce_mb for r in mine]),
                hessian_steps=mine[0].hessian_steps if mine else None,
                x_step=_median([_ratio(r.step_ms, b.step_ms) for r, b in pairs]),
                x_plain_step=_median([_ratio(r.plain_step_ms, b.step_ms) for r, b in pairs]),
                x_allreduce=_median([_ratio(r.allreduce_ms, b.allreduce_ms) for r, b in pairs]),
                x_wait=_median([_ratio(r.wait_ms, b.wait_ms) for r, b in pairs]),
                x_bytes=_median([_ratio(r.allreduce_mb, b.allreduce_mb) for r, b in pairs]),
            )
        )
    return out


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or a dash when missing."""
    return "-" if value is None else format(value, spec)


def table(summaries: list[Summary]) -> Table:
    """The summaries as a Markdown-style table."""
    t = Table(box=box.MARKDOWN)
    heads = ("optimizer", "rounds", "step ms", "x adamw", "plain ms", "x adamw")
    heads += ("all-reduce ms", "x adamw")
    heads += ("wait ms", "x adamw", "MB/step", "x adamw")
    for head in heads:
        t.add_column(head, justify="left" if head == "optimizer" else "right")
    for r in summaries:
        t.add_row(
            r.optimizer,
            str(r.rounds),
            fmt(r.step_ms, ",.1f"),
            fmt(r.x_step, ".3f"),
            fmt(r.plain_step_ms, ",.1f"),
            fmt(r.x_plain_step, ".3f"),
            fmt(r.allreduce_ms, ",.2f"),
            fmt(r.x_allreduce, ".3f"),
            fmt(r.wait_ms, ",.2f"),
            fmt(r.x_wait, ".3f"),
            fmt(r.allreduce_mb, ",.3f"),
            fmt(r.x_bytes, ".3f"),
        )
    return t


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (the driver's; ``--worker`` and its flags are for torchrun)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="tiny", choices=("tiny", "small"))
    p.add_argument("--steps", type=int, default=45, help="steps per run (default: 45)")
    p.add_argument(
        "--warmup", type=int, default=5, help="leading steps left out (default: 5, leaving 40)"
    )
    p.add_argument(
        "--optimizers",
        type=_names,
        default=DEFAULT_OPTIMIZERS,
        help=f"comma-separated, of {', '.join(OPTIMIZERS)} (default: adamw,sophia); "
        "adamw is always run first, as the baseline",
    )
    p.add_argument("--rounds", type=int, default=3, help="turns of every optimizer (default: 3)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--optimizer", choices=tuple(OPTIMIZERS), help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup must be in [0, --steps), got {args.warmup}")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    return args


def _names(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in OPTIMIZERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown optimizer(s) {', '.join(unknown)}; expected some of {', '.join(OPTIMIZERS)}"
        )
    return (BASELINE, *[n for n in dict.fromkeys(names) if n != BASELINE])


def main(argv: list[str] | None = None) -> int:
    """Run each optimizer, print the table, write the JSON; 1 if any run failed."""
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    out: Path = args.out if args.out != DEFAULT_OUT else REPO / DEFAULT_OUT
    started, load_start = time.perf_counter(), os.getloadavg()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tightrope-bench-") as tmp:
        for turn in range(args.rounds):
            # Every other round in reverse order: a slot's share of the load falls on each.
            order = args.optimizers if turn % 2 == 0 else args.optimizers[::-1]
            for optimizer in order:
                what = f"{args.preset}, {args.steps} steps on {RANKS} ranks"
                print(f"[{turn + 1}/{args.rounds}] {optimizer}: {what} ...", end=" ", flush=True)
                row = measure(args, optimizer, Path(tmp) / f"{optimizer}-{turn}")
                row.round = turn
                rows.append(row)
                print(f"{row.wall_s:.1f} s" if row.ok else f"FAILED\n{row.error}", flush=True)
    summaries = summarize(rows, args.optimizers)
    failed = [f"{r.optimizer} (round {r.round + 1})" for r in rows if not r.ok]
    meta: dict[str, Any] = {
        "benchmark": "optimizers",
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "preset": args.preset,
        "ranks": RANKS,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "sophia_hessian_every": _hessian_every(),
        "baseline": BASELINE,
        "torch": version("torch"),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "total_wall_s": round(time.perf_counter() - started, 1),
        "failed": failed,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {"summary": [asdict(x) for x in summaries], "runs": [asdict(r) for r in rows]}
    out.write_text(json.dumps({**meta, **results}, indent=2) + "\n")
    measured = f"steps {args.warmup + 1}..{args.steps}"
    print(f"\nmeans over {measured} of both ranks, medians over rounds; x adamw: over AdamW's\n")
    Console(width=160, highlight=False).print(table(summaries))
    print(f"\nwrote {out}")
    if load_start[0] > (os.cpu_count() or 2) / 2:
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
