"""What the stability mechanisms cost: step time of the reference trainer with every
mechanism on, against the named baseline ``--fragile`` (all of them off), and the figure
per mechanism (everything on but that one).

Every variant is the same command (``python -m reference_trainer --preset small``, one
rank, fp32 unless ``--precision`` says otherwise), run in interleaved rounds so that load
on the machine falls on all of them alike; a variant's figure is the median step time of
its steps after the first ``--skip`` (compile and warm-up), pooled over its rounds. No
checkpoint is written inside the measured steps (the checkpoint cost is
``benchmarks/checkpoint.py``'s). Target: everything on <= 1.10x fragile on ``small``.

    .venv/bin/python benchmarks/mechanisms.py [--preset small] [--steps 30] [--rounds 2]
        [--mechanisms all|none|clipping,spikes,...] [--nproc 1] [--timing step|interval]

``replica_check`` acts between steps and only with several ranks: measure it with
``--nproc 2 --timing interval``.
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

from rich.console import Console
from rich.table import Table

from harness.mechanisms import TRAINER_MECHANISMS
from harness.records.journal import read_journal
from harness.records.microscope_file import MICROSCOPE_ENV

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.10


def variants(mechanisms: list[str]) -> dict[str, list[str]]:
    """Flags of every variant: the baseline, everything on, everything on but one."""
    out = {"fragile (baseline)": ["--fragile"], "everything on": []}
    for name in mechanisms:
        out[f"without {name}"] = ["--disable", name]
    return out


def _mechanisms(text: str) -> list[str]:
    if text == "all":
        return list(TRAINER_MECHANISMS)
    if text == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TRAINER_MECHANISMS]
    if unknown:
        known = ", ".join(TRAINER_MECHANISMS)
        raise argparse.ArgumentTypeError(
            f"unknown mechanism(s) {', '.join(unknown)}; choose from {known}"
        )
    return names


def run_variant(
    args: argparse.Namespace,
    flags: list[str],
    work: Path,
    env: dict[str, str] | None = None,
    launcher: list[str] | None = None,
) -> Path:
    """Run the variant once (``env`` over ours; ``launcher`` instead of ``python -m
    reference_trainer`` on one rank); its run directory."""
    run_dir = Path(tempfile.mkdtemp(dir=work))
    launcher = launcher or [sys.executable, "-m", "reference_trainer"]
    if args.nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(args.nproc), "-m", "reference_trainer"]  # fmt: skip
    cmd = [*launcher, "--preset", args.preset,
           "--precision", args.precision, "--steps", str(args.steps),
           "--checkpoint-every", str(args.steps), "--log-every", str(args.steps),
           "--run-dir", str(run_dir), *flags]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **(env or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"{' '.join(flags) or 'everything on'} failed:\n{proc.stderr[-2000:]}")
    return run_dir


def measured_times(args: argparse.Namespace, run_dir: Path) -> list[float]:
    """A run's step times (``--timing``), after its first ``--skip`` steps."""
    steps = read_journal(run_dir).steps()
    if args.timing == "interval":
        # Wall time from one step event to the next: the step and everything the loop does
        # around it (checks between steps, such as the replica comparison, included).
        mono = {s: float(steps[s].mono) for s in steps}
        return [mono[s] - mono[s - 1] for s in sorted(mono) if s > args.skip and s - 1 in mono]
    return [float(steps[s]["step_time"]) for s in sorted(steps) if s > args.skip]


def step_times(args: argparse.Namespace, flags: list[str], work: Path) -> list[float]:
    """Step times of one run of the variant, after its first ``--skip`` steps (the
    microscope off: benchmarks/microscope.py measures it)."""
    return measured_times(args, run_variant(args, flags, work, {MICROSCOPE_ENV: "off"}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=("tiny", "small"))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps left out")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--mechanisms",
        type=_mechanisms,
        default="all",
        help="measured one by one (all, none, or names with commas; default all)",
    )
    parser.add_argument("--nproc", type=int, default=1, help="ranks (torchrun when > 1)")
    parser.add_argument(
        "--timing",
        default="step",
        choices=("step", "interval"),
        help="step: the trainer's step_time; interval: wall time between step events, "
        "which includes the loop's checks between steps (averaged, not the median)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/mechanisms.json")
    args = parser.parse_args(argv)
    if args.steps <= args.skip:
        parser.error(f"--steps {args.steps} must be more than --skip {args.skip}")
    table = variants(args.mechanisms)
    pooled: dict[str, list[float]] = {name: [] for name in table}
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, flags) in enumerate(table.items(), 1):
                console.print(f"round {r + 1}/{args.rounds}, {i}/{len(table)}: {name}")
                pooled[name] += step_times(args, flags, Path(tmp))
    # A periodic cost (every 10th step) vanishes in a median: intervals are averaged.
    pool = statistics.mean if args.timing == "interval" else statistics.median
    median = {name: pool(times) for name, times in pooled.items()}
    base, full = median["fragile (baseline)"], median["everything on"]
    rows = []
    for name in table:
        rows.append({
            "variant": name,
            "median_step_s": median[name],
            "steps": len(pooled[name]),
            "vs_fragile": median[name] / base,
            # What that mechanism costs: everything on over everything on but it.
            "its_cost": full / median[name] if name.startswith("without ") else None,
        })  # fmt: skip
    result = {
        "benchmark": "mechanisms",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "preset": args.preset,
        "precision": args.precision,
        "nproc": args.nproc,
        "timing": args.timing,
        "steps": args.steps,
        "skip": args.skip,
        "rounds": args.rounds,
        "baseline": "fragile (every mechanism off), same command, interleaved rounds",
        "everything_on_vs_fragile": full / base,
        "target": TARGET,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    out = Table(title=f"stability mechanisms, {args.preset} {args.precision}")
    measure = "mean interval" if args.timing == "interval" else "median step"
    for column in ("variant", measure, "vs fragile", "its cost"):
        out.add_column(column, justify="left" if column == "variant" else "right")
    for row in rows:
        cost = f"{row['its_cost']:.3f}x" if row["its_cost"] is not None else ""
        out.add_row(row["variant"], f"{row['median_step_s'] * 1e3:.1f} ms",
                    f"{row['vs_fragile']:.3f}x", cost)  # fmt: skip
    console.print(out)
    verdict = "within" if full / base <= TARGET else "OVER"
    console.print(
        f"everything on / fragile = {full / base:.3f}x ({verdict} the {TARGET:.2f}x target); "
        f"{args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
