"""``tightrope sweep SWEEP.yaml``: one scenario over a grid of trainer settings and many
seeds; per cell the success rate with its Wilson interval, final loss, time and steps lost,
and which cells differ. Exit 0 when every cell reached the file's ``min_success`` (or it
sets none), 1 when one did not, 2 on invalid input, 130 when stopped (what finished is
kept, and the next run of the same sweep goes on from there). docs/sweeps.md.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from harness.commands.executor_args import add_executor_args, chosen_executor
from harness.commands.suite import _cores, interrupt
from harness.tables import Column, command_console, print_table


def _seed_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of seeds, got {text!r}")
    return int(text)


def add_commands(commands: Any) -> None:
    """Add ``sweep`` to the ``tightrope`` parser."""
    sweep = commands.add_parser(
        "sweep",
        help="run a scenario over a grid of trainer settings and seeds; success rates",
        description="Run the sweep file's scenario once per cell of its grid and per seed, "
        "judge every run as a suite's scenario, and write sweep.json, sweep.md and sweep.html "
        "(success rate with a 95%% Wilson interval, final loss, run time, steps lost, which "
        "cells differ). Finished runs are cached: a stopped sweep goes on where it ended. "
        "Exit 0 when every cell met min_success, 1 when not, 2 on bad input, 130 stopped.",
    )
    sweep.add_argument("sweep", type=Path, metavar="SWEEP.yaml")
    sweep.add_argument(
        "--out", type=Path, metavar="DIR", help="where runs and reports go (runs/sweep-NAME)"
    )
    sweep.add_argument("--cores", type=_cores, metavar="N", help="cores to fill (default: all)")
    sweep.add_argument(
        "--seeds", type=_seed_count, metavar="N", help="the first N seeds only (a quick look)"
    )
    sweep.add_argument("--no-cache", action="store_true", help="run every run again")
    add_executor_args(sweep)
    sweep.set_defaults(handler=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    import dataclasses

    from harness.sweeps.report import write_reports
    from harness.sweeps.run_sweep import SweepOptions, run_sweep
    from harness.sweeps.summary import summarize
    from harness.sweeps.sweep_file import load_sweep

    sweep = load_sweep(args.sweep)
    if args.seeds is not None:
        sweep = dataclasses.replace(sweep, seeds=sweep.seeds[: args.seeds])
    out_dir = args.out or Path("runs") / f"sweep-{sweep.name}"
    options = SweepOptions(out_dir=out_dir, use_cache=not args.no_cache)
    if args.cores is not None:
        options.cores = args.cores
    console = command_console()
    console.print(
        f"sweep {sweep.name}: {len(sweep.cells())} cells x {len(sweep.seeds)} seeds = "
        f"{sweep.runs} runs, {options.cores} cores; out: {out_dir}",
        highlight=False,
        markup=False,
    )
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with chosen_executor(args) as options.executor:
            run = run_sweep(sweep, options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    cells = summarize(run)
    paths = write_reports(run, out_dir, cells)
    columns = [
        Column("cell"),
        Column("settings", wrap=True),
        Column("success", justify="right"),
        Column("95% interval", justify="right"),
        Column("final loss", justify="right"),
        Column("lost", justify="right"),
        Column("s/run", justify="right"),
    ]
    rows = [
        [
            c.cell.slug,
            c.cell.label,
            f"{c.passed}/{c.runs}",
            f"{c.interval[0] * 100:.0f}-{c.interval[1] * 100:.0f}%",
            "n/a" if c.final_loss is None else f"{c.final_loss.median:.3f}",
            "n/a" if c.steps_lost is None else f"{c.steps_lost.median:.0f}",
            "n/a" if c.run_seconds is None else f"{c.run_seconds.median:.1f}",
        ]
        for c in cells
    ]
    print_table(console, f"sweep {sweep.name}", columns, rows)
    console.print("reports: " + "  ".join(str(p) for p in paths), highlight=False, markup=False)
    if run.interrupted:
        console.print(
            f"stopped: {len(run.records)}/{sweep.runs} runs kept; run the same command to go on",
            markup=False,
        )
        return 130
    below = [c.cell.label for c in cells if not c.meets(sweep.min_success)]
    if below:
        console.print(f"below min_success {sweep.min_success:g}: " + "; ".join(below), markup=False)
        return 1
    return 0
