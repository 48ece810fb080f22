"""What the training microscope costs: wall time per step and disk bytes per 1,000 steps of
the reference trainer with the microscope on (its defaults: every 10 steps, a 5-step ring),
against the named baseline: the same command with ``TIGHTROPE_MICROSCOPE=off``.

Every variant is ``python -m reference_trainer --preset small`` (one rank, fp32 unless
``--precision`` says otherwise), run in interleaved rounds so load on the machine falls on
all alike. The figure is the mean wall interval between step events after the first
``--skip`` (the recorder's work sits at the step's edges and on every 10th step, outside
the trainer's own ``step_time``, and a median would hide a periodic cost). A third variant,
``fragile, microscope off``, gives the stability mechanisms' cost figure with the
microscope in it: everything on with the microscope over fragile without it, against the
mechanisms' 1.10x target (benchmarks/mechanisms.py).

    .venv/bin/python benchmarks/microscope.py [--preset small] [--steps 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
from pathlib import Path

from mechanisms import TARGET, measured_times, run_variant
from rich.console import Console
from rich.table import Table

from harness.records.microscope_file import MICROSCOPE_ENV, bytes_on_disk, read_microscope

ROOT = Path(__file__).resolve().parent.parent
VARIANTS: dict[str, tuple[list[str], str]] = {
    "microscope off (baseline)": ([], "off"),
    "microscope on": ([], "on"),
    "fragile, microscope off": (["--fragile"], "off"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=("tiny", "small"))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps left out")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/microscope.json")
    args = parser.parse_args(argv)
    if args.steps <= args.skip:
        parser.error(f"--steps {args.steps} must be more than --skip {args.skip}")
    args.nproc, args.timing = 1, "interval"
    pooled: dict[str, list[float]] = {name: [] for name in VARIANTS}
    disk: list[tuple[int, int]] = []  # (bytes, steps recorded over) of each "on" run
    records: list[int] = []
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, (flags, switch)) in enumerate(VARIANTS.items(), 1):
                console.print(f"round {r + 1}/{args.rounds}, {i}/{len(VARIANTS)}: {name}")
                run_dir = run_variant(args, flags, Path(tmp), {MICROSCOPE_ENV: switch})
                pooled[name] += measured_times(args, run_dir)
                if switch == "on":
                    disk.append((bytes_on_disk(run_dir), args.steps))
                    records.append(len(read_microscope(run_dir).ranks[0]))
                elif bytes_on_disk(run_dir):
                    sys.exit(f"{name}: the microscope recorded although it was off")
    mean = {name: statistics.mean(times) for name, times in pooled.items()}
    base, on, fragile = (mean[n] for n in VARIANTS)
    per_1000 = statistics.mean(b / s * 1000 for b, s in disk)
    result = {
        "benchmark": "microscope",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "preset": args.preset,
        "precision": args.precision,
        "steps": args.steps,
        "skip": args.skip,
        "rounds": args.rounds,
        "baseline": "microscope off (TIGHTROPE_MICROSCOPE=off), same command, interleaved",
        "mean_interval_s": mean,
        "intervals": {name: len(times) for name, times in pooled.items()},
        "recording_cost_ms_per_step": (on - base) * 1e3,
        "on_vs_off": on / base,
        "records_per_run": records,
        "disk_bytes_per_1000_steps": per_1000,
        "everything_on_with_microscope_vs_fragile": on / fragile,
        "mechanisms_target": TARGET,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"microscope, {args.preset} {args.precision}, mean step interval")
    for column in ("variant", "mean interval", "vs baseline"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for name in VARIANTS:
        table.add_row(name, f"{mean[name] * 1e3:.1f} ms", f"{mean[name] / base:.3f}x")
    console.print(table)
    verdict = "within" if on / fragile <= TARGET else "OVER"
    console.print(
        f"recording cost {(on - base) * 1e3:+.1f} ms/step ({on / base:.3f}x); "
        f"disk {per_1000 / 1024:.1f} KiB per 1,000 steps; everything on with the microscope "
        f"/ fragile without = {on / fragile:.3f}x ({verdict} the {TARGET:.2f}x target); {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
