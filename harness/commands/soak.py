"""``tightrope soak``: the reference trainer under random faults for a while; the
invariants judged, the cost measured (ETTR, goodput, time to recover), a broken
invariant shrunk to a minimal plan. Exit 0 when every invariant held, 1 when one broke
(or the run errored), 2 on invalid input. docs/soak.md.
"""

from __future__ import annotations

import argparse
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.markup import escape

from faults.spec import MAX_STEP
from harness.commands.executor_args import add_executor_args, chosen_executor
from harness.commands.suite import UsageError, interrupt
from harness.errors import TightropeError
from harness.tables import command_console

#: The largest values the soak's counts and lengths take: a week of minutes, the steps a
#: fault may name, as many ranks as this machine could start.
MAX_MINUTES = 7 * 24 * 60.0
MAX_WORLD_SIZE = 1024


def _positive(kind: type[float] | type[int], what: str, most: float = MAX_STEP) -> Any:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not 0 < value <= most:  # NaN fails both
            raise argparse.ArgumentTypeError(f"expected {what} up to {most:,.0f}, got {text!r}")
        return value

    return parse


def _seed(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected faults per step in (0, 1], got {text!r}")
    return value


def add_commands(commands: Any) -> None:
    """Add ``soak`` to the ``tightrope`` parser."""
    soak = commands.add_parser(
        "soak",
        help="train for a while under random faults; judge the invariants, measure ETTR",
        description="Run the reference trainer (torchrun, restarts) while faults arrive at "
        "random (Poisson, drawn from --seed), judge the invariants (finished, finite kept "
        "weights, no corrupt checkpoint loaded, no stall past --max-stall, final loss near "
        "a fault-free run's, no process left), report ETTR, goodput and time to recover per "
        "fault kind, and shrink the plan of a broken invariant to a minimal one "
        "(OUT/minimal.yaml). Exit 0 when every invariant held, 1 when not, 2 on bad input.",
    )
    length = soak.add_mutually_exclusive_group()
    length.add_argument(
        "--minutes",
        type=_positive(float, "a positive number of minutes", MAX_MINUTES),
        help="fill about this much fault-free training time (default: 10)",
    )
    length.add_argument(
        "--steps", type=_positive(int, "a positive integer"), help="train this many steps"
    )
    soak.add_argument("--rate", type=_rate, default=0.01, help="faults per step (default 0.01)")
    soak.add_argument("--seed", type=_seed, default=0, help="seed of the faults (default 0)")
    soak.add_argument(
        "--kinds", metavar="K1,K2", help="fault kinds to draw from (default: every step kind)"
    )
    soak.add_argument(
        "--preset",
        choices=("reference", "fragile"),
        default="reference",
        help="every stability mechanism on (reference, default) or off (fragile)",
    )
    soak.add_argument("--model", choices=("tiny", "small"), default="tiny", help="(tiny)")
    soak.add_argument(
        "--world-size",
        type=_positive(int, "a positive integer", MAX_WORLD_SIZE),
        default=2,
        help="ranks (2)",
    )
    soak.add_argument(
        "--checkpoint-every",
        type=_positive(int, "a positive integer"),
        default=50,
        help="steps between checkpoints (default 50)",
    )
    soak.add_argument(
        "--loss-tolerance",
        type=_positive(float, "a positive number"),
        default=0.1,
        help="largest relative gap to the fault-free final loss (default 0.1)",
    )
    soak.add_argument(
        "--max-stall",
        type=_positive(float, "a positive number of seconds", MAX_MINUTES * 60),
        default=60.0,
        help="longest wait between finished steps, restarts included (default 60 s)",
    )
    soak.add_argument("--no-shrink", action="store_true", help="do not shrink a broken plan")
    soak.add_argument(
        "--shrink-minutes",
        type=_positive(float, "a positive number of minutes", MAX_MINUTES),
        default=15.0,
        help="time shrinking may take (default 15)",
    )
    soak.add_argument(
        "--scorecard", type=Path, metavar="DIR", help="where results go (runs/soak-seed-SEED)"
    )
    soak.add_argument("--no-cache", action="store_true", help="rerun the fault-free runs")
    add_executor_args(soak)
    soak.set_defaults(handler=_soak)


def _soak(args: argparse.Namespace) -> int:
    from harness.soak.plan import check_kinds
    from harness.soak.soak import SoakOptions

    kinds = None if args.kinds is None else check_kinds(args.kinds.split(","))
    out_dir = args.scorecard or Path("runs") / f"soak-seed-{args.seed}"
    if args.world_size > 64:
        raise UsageError(f"--world-size {args.world_size}: at most 64 ranks")
    console = command_console()
    options = SoakOptions(
        out_dir=out_dir,
        seconds=None if args.steps else 60.0 * (args.minutes or 10.0),
        steps=args.steps,
        rate=args.rate,
        seed=args.seed,
        kinds=kinds,
        preset=args.preset,
        model=args.model,
        world_size=args.world_size,
        checkpoint_every=args.checkpoint_every,
        loss_tolerance=args.loss_tolerance,
        max_stall=args.max_stall,
        shrink=not args.no_shrink,
        shrink_seconds=60.0 * args.shrink_minutes,
        use_cache=not args.no_cache,
        say=lambda line: console.print(escape(line), highlight=False),
    )
    with chosen_executor(args) as executor:
        options.executor = executor
        return _soak_with(options, console, out_dir, args.seed)


def _soak_with(options: Any, console: Any, out_dir: Path, seed: int) -> int:
    from harness.running.runner import wait_or_stop
    from harness.scorecard.render import write_scorecards
    from harness.scorecard.render.terminal import print_results
    from harness.soak.soak import run_soak

    # The soak runs in a worker thread; Ctrl-C or SIGTERM here sets its stop event, which
    # kills every launch within a second, and the results so far are still written.
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(run_soak, options)
            wait_or_stop([future], options.stop)
            try:
                outcome = future.result()
            except TightropeError:
                if options.stop.is_set():  # stopped in its calibration run
                    console.print("tightrope: soak interrupted", highlight=False)
                    return 130
                raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    files = write_scorecards(outcome.result, out_dir)
    print_results(outcome.result, console)
    if outcome.broken is not None:
        console.print(f"[bold red]{escape(outcome.broken)} broke[/] (seed {seed})")
        if outcome.minimal is not None and outcome.minimal_file is not None:
            how = "minimal plan"
            if not outcome.shrink_complete:
                how = "smallest failing plan seen before the shrinking budget ran out"
            console.print(
                f"{how}: {len(outcome.minimal)} of {len(outcome.plan)} faults, after "
                f"{outcome.shrink_trials} trial runs; replay it with "
                f"`tightrope run {outcome.minimal_file}`",
                highlight=False,
            )
            console.print(escape(outcome.minimal_file.read_text()), highlight=False)
    console.print(f"scorecards: {files['html']}  {files['json']}", highlight=False)
    if outcome.result.interrupted:
        return 130
    return 0 if outcome.broken is None and outcome.result.passed else 1
