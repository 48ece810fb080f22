"""What the training microscope costs: wall time per step and disk bytes per 1,000 steps of
the reference trainer with the microscope on (its defaults: every 10 steps, a 5-step ring),
against the named baseline: the same command with ``TIGHTROPE_MICROSCOPE=off``.

Every variant is ``python -m reference_trainer --preset small`` (one rank, fp32 unless
``--precision`` says otherwise), run in interleaved rounds so load on the machine falls on
all alike. The figure is the mean wall interval between step events after the first
``--skip`` (the recorder's work sits at the step's edges and on every 10th step, outside
the trainer's own ``step_time``, and a median would hide a periodic cost). The "on" runs also
time the recorder's own calls, and the histograms its hooks take during forward, from the
inside (a wrapper around them; the trainer is the same command, started by ``python -c``):
that share of a step is the figure other load on the machine hardly moves. A third variant,
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

#: Runs the reference trainer with the recorder's calls (and the samples its output hooks
#: take during forward; they are binned inside the recorder's calls) timed, and writes
#: their total seconds to $RECORDER_TIME_OUT at exit.
TIMED = """
import atexit, json, os, runpy, sys, time
from harness.inside import microscope
spent = [0.0]
def timed(f):
    def call(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t
    return call
for name in ("begin_step", "after_backward", "before_update", "after_update", "end_step",
             "mark_anomaly", "fault_injected", "close"):
    setattr(microscope.Microscope, name, timed(getattr(microscope.Microscope, name)))
from harness.inside import layer_figures  # the output hooks' sampling, during forward
layer_figures.OutputSamples.add = timed(layer_figures.OutputSamples.add)
atexit.register(lambda: open(os.environ["RECORDER_TIME_OUT"], "w").write(json.dumps(spent[0])))
sys.argv = ["reference_trainer", *sys.argv[1:]]
runpy.run_module("reference_trainer", run_name="__main__")
"""

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
    inside: list[float] = []  # seconds per step inside the recorder, each "on" run
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, (flags, switch)) in enumerate(VARIANTS.items(), 1):
                console.print(f"round {r + 1}/{args.rounds}, {i}/{len(VARIANTS)}: {name}")
                spent = Path(tmp) / f"recorder-{r}-{i}.json"
                env = {MICROSCOPE_ENV: switch, "RECORDER_TIME_OUT": str(spent)}
                timed = [sys.executable, "-c", TIMED] if switch == "on" else None
                run_dir = run_variant(args, flags, Path(tmp), env, timed)
                pooled[name] += measured_times(args, run_dir)
                if switch == "on":
                    disk.append((bytes_on_disk(run_dir), args.steps))
                    records.append(len(read_microscope(run_dir).ranks[0]))
                    inside.append(json.loads(spent.read_text()) / args.steps)
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
        "in_recorder_ms_per_step": [x * 1e3 for x in inside],
        "in_recorder_share_of_step": statistics.mean(inside) / on,
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
        f"time inside the recorder {statistics.mean(inside) * 1e3:.1f} ms/step "
        f"({statistics.mean(inside) / on:.1%} of a step: the load-proof figure); "
        f"recording cost {(on - base) * 1e3:+.1f} ms/step ({on / base:.3f}x); "
        f"disk {per_1000 / 1024:.1f} KiB per 1,000 steps; everything on with the microscope "
        f"/ fragile without = {on / fragile:.3f}x ({verdict} the {TARGET:.2f}x target); {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
