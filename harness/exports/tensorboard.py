"""A run as TensorBoard event files: ``DIR/rank-R/events.out.tfevents.*``, one folder per
rank, for ``tensorboard --logdir DIR`` (docs/exports.md).

Written with torch's ``SummaryWriter``, which needs the ``tensorboard`` package (the
``tensorboard`` extra): torch is already a dependency, and the same package is what shows
the files, so writing them costs no dependency a team viewing them lacks. It is imported
only when an export runs. What is written is `harness.exports.tensorboard_points`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import TightropeError
from harness.exports.tensorboard_points import Histogram, Point, Scalar, Text, collect
from harness.records.journal import read_journal
from harness.records.microscope_file import MicroscopeFileError, read_microscope

INSTALL_HINT = (
    "the TensorBoard export needs the tensorboard package: "
    "pip install 'tightrope[tensorboard]' (or: pip install 'tensorboard>=2.14,<3')"
)
_EVENT_FILES = "events.out.tfevents.*"


class ExportError(TightropeError):
    """An export could not be written (a missing package, an output that is no folder)."""


@dataclass(slots=True)
class ExportCounts:
    """What an export wrote, per kind of point."""

    out_dir: Path
    ranks: list[int] = field(default_factory=list)
    scalars: int = 0
    histograms: int = 0
    texts: int = 0
    tags: set[str] = field(default_factory=set)
    replaced: int = 0  # event files of an earlier export removed first
    notes: list[str] = field(default_factory=list)  # torn journal lines skipped

    @property
    def points(self) -> int:
        """Every point written."""
        return self.scalars + self.histograms + self.texts


def summary_writer_class() -> Any:
    """torch's ``SummaryWriter``, or an `ExportError` saying what to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch says "TensorBoard logging requires TensorBoard ..."
        raise ExportError(INSTALL_HINT) from exc
    return SummaryWriter


def export_tensorboard(
    run_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    on_total: Callable[[int], None] | None = None,
    on_point: Callable[[], None] | None = None,
) -> ExportCounts:
    """Write a run's journal and microscope as event files under ``out_dir``, replacing an
    earlier export there; ``on_total`` hears how many points there are, ``on_point`` each
    one written (a progress bar)."""
    writer_class = summary_writer_class()  # before anything is read or removed
    journal = read_journal(run_dir, warn=False)
    # An unreadable chunk is skipped with a warning naming it (the reader has no quiet
    # mode; the warning is the one report of it).
    try:
        microscope = read_microscope(run_dir)
    except MicroscopeFileError as exc:  # written by a newer tightrope
        raise ExportError(str(exc)) from exc
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--tensorboard {out}: exists and is not a folder")
    counts = ExportCounts(out_dir=out, notes=list(journal.skipped))
    by_rank = collect(journal, microscope)
    counts.replaced = remove_earlier_export(out)
    ordered = {rank: points.sorted_points() for rank, points in by_rank.items()}
    if on_total is not None:
        on_total(sum(len(p) for p in ordered.values()))
    for rank, points in ordered.items():
        counts.ranks.append(rank)
        writer = writer_class(log_dir=str(out / f"rank-{rank}"), max_queue=1000)
        try:
            for point in points:
                _write(writer, point, counts)
                if on_point is not None:
                    on_point()
        finally:
            writer.close()
    return counts


def remove_earlier_export(out: Path) -> int:
    """Remove the event files of an earlier export (``out/rank-*/events.out.tfevents.*``)
    so that no point is there twice; other files are left alone. Returns how many."""
    removed = 0
    if not out.is_dir():
        return 0
    for folder in sorted(out.glob("rank-*")):
        if not folder.is_dir():
            continue
        for path in folder.glob(_EVENT_FILES):
            path.unlink()
            removed += 1
        if not any(folder.iterdir()):
            shutil.rmtree(folder)
    return removed


def _write(writer: Any, point: Point, counts: ExportCounts) -> None:
    counts.tags.add(point.tag)
    if isinstance(point, Scalar):
        writer.add_scalar(point.tag, point.value, global_step=point.step, walltime=point.wall)
        counts.scalars += 1
    elif isinstance(point, Histogram):
        writer.add_histogram_raw(
            point.tag,
            min=point.min,
            max=point.max,
            num=point.num,
            sum=point.sum,
            sum_squares=point.sum_squares,
            bucket_limits=list(point.bucket_limits),
            bucket_counts=list(point.bucket_counts),
            global_step=point.step,
            walltime=point.wall,
        )
        counts.histograms += 1
    elif isinstance(point, Text):
        writer.add_text(point.tag, point.text, global_step=point.step, walltime=point.wall)
        counts.texts += 1
