"""``tightrope export RUN_DIR --tensorboard DIR``: a run's journal and microscope as
TensorBoard event files (docs/exports.md). Exit 0 when written, 2 on bad input (no journal,
the tensorboard package missing)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from harness.exports.tensorboard import ExportCounts, export_tensorboard
from harness.tables import command_console

#: Fewer points than this are written before a progress bar would have drawn once.
_BAR_FROM = 2000


def add_commands(commands: Any) -> None:
    """Add ``export`` to the ``tightrope`` parser."""
    export = commands.add_parser(
        "export",
        help="write a run as TensorBoard event files (scalars, histograms, faults)",
        description="Write a run's journal and microscope where people already look: "
        "--tensorboard DIR writes one folder per rank (DIR/rank-R/) for `tensorboard "
        "--logdir DIR`: the steps' scalars, per-layer gradient and weight norms and update "
        "ratios, activation histograms, all-reduce and point-to-point times, and faults, "
        "detections and recoveries as text at their steps. An earlier export into DIR is "
        "replaced. Exit 0 when written, 2 on bad input or a missing tensorboard package.",
    )
    export.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    export.add_argument(
        "--tensorboard",
        type=Path,
        required=True,
        metavar="DIR",
        help="write TensorBoard event files under DIR (needs tightrope[tensorboard])",
    )
    export.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    console = command_console()
    progress = Progress(
        TextColumn("exporting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task: list[TaskID] = []  # made once the total is known, so its clock starts then

    def on_total(total: int) -> None:
        task.append(progress.add_task("export", total=total))
        if total >= _BAR_FROM:
            progress.start()

    try:
        counts = export_tensorboard(
            args.run_dir,
            args.tensorboard,
            on_total=on_total,
            on_point=lambda: progress.advance(task[0]),
        )
    finally:
        progress.stop()
    for note in counts.notes:
        print(f"tightrope: warning: {note}", file=sys.stderr)
    _report(counts)
    return 0


def _report(counts: ExportCounts) -> None:
    ranks = ", ".join(str(r) for r in counts.ranks) or "none"
    replaced = f" (replaced {counts.replaced} earlier event files)" if counts.replaced else ""
    print(f"wrote {counts.out_dir}: {counts.points} points{replaced}")
    print(f"ranks       {ranks}")
    print(f"scalars     {counts.scalars}")
    print(f"histograms  {counts.histograms}")
    print(f"texts       {counts.texts}")
    print(f"tags        {len(counts.tags)}")
    print(f"open with   tensorboard --logdir {counts.out_dir}")
