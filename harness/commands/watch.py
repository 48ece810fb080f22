"""``tightrope watch RUN_DIR``: a live terminal view of a running job (docs/watch.md)."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from faults.spec import MAX_RANKS
from harness.live.watch_reader import WatchReader
from harness.live.watch_view import render


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number), got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def rank_number(text: str) -> int:
    """An argparse type: a rank, from 0 to `MAX_RANKS` - 1 (``watch``, ``inject``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rank (an integer), got {text!r}") from None
    if not 0 <= value < MAX_RANKS:
        raise argparse.ArgumentTypeError(f"must be a rank from 0 to {MAX_RANKS - 1}, got {text}")
    return value


def add_commands(commands: Any) -> None:
    """Add ``watch`` to the ``tightrope`` parser."""
    watch = commands.add_parser(
        "watch",
        help="live terminal view of a running job: step, loss, hottest layers, faults",
        description="A live view of a running job, refreshed until it ends (every rank's "
        "run_end, or its background process gone) or Ctrl-C: step, loss with its recent "
        "trend, lr, loss scale, grad norm, steps/s; the layers whose gradient norm is "
        "furthest above their own median; armed and fired faults; seconds since each rank "
        "was last heard of. It only reads the run directory. Exit 0 when the job ended or "
        "on Ctrl-C, 2 on bad input.",
    )
    watch.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    watch.add_argument(
        "--interval", type=_positive_seconds, default=1.0, metavar="S", help="seconds per refresh"
    )
    watch.add_argument("--once", action="store_true", help="print one frame and exit")
    watch.add_argument(
        "--rank",
        type=rank_number,
        metavar="R",
        help="show this rank's steps and layers (default: all)",
    )
    watch.set_defaults(handler=_watch)


def _watch(args: argparse.Namespace) -> int:
    reader = WatchReader(args.run_dir)  # a WatchError (missing dir, no journal): exit 2
    console = Console()
    if args.once:
        console.print(render(reader.refresh(), args.rank))
        return 0
    # Ctrl-C only sets a flag that the loop reads between frames: a KeyboardInterrupt raised
    # in the middle of drawing could leave the terminal half written, and one raised where
    # an exception is ignored (a finalizer) would be lost and the view would go on.
    # (A plain list, not an Event: setting an Event takes a lock the interrupted main thread
    # may be holding.)
    stopped: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: stopped.append(signum))
    try:
        snapshot = reader.refresh()
        with Live(render(snapshot, args.rank), console=console, auto_refresh=False) as live:
            while not snapshot.ended:
                time.sleep(args.interval)
                if stopped:
                    break
                snapshot = reader.refresh()
                live.update(render(snapshot, args.rank), refresh=True)
    finally:
        if previous is not None:  # None: set outside Python, cannot be put back
            signal.signal(signal.SIGINT, previous)
    return 0  # the job ended, or the user is done watching (the job goes on)
