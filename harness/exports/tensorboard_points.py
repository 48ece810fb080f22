"""What a run's TensorBoard export holds, point by point, before anything is written
(docs/exports.md).

One rank's points come from two records: the journal's ``step`` events (the run's scalars)
and its fault, detection and recovery events (text at their steps), and the microscope
(per-layer scalars, activation histograms, all-reduce time and point-to-point round trips).
Kept apart from the writer so what is exported can be read and tested without TensorBoard.

The microscope's histogram bins map onto TensorBoard's buckets without losing a count
(`tensorboard_buckets`): TensorBoard gives each bucket an upper limit, its lower edge being
the previous bucket's limit. The exact zeros are the bucket whose limit is 0; the 32
half-decade bins keep their own upper edges (the first reaches down to 0, as the bin holds
anything non-zero below 1e-8); finite values of at least 1e8 are one more bucket up to
10^8.5; the non-finite count has no place on an axis and is its own scalar,
``act_nonfinite/LAYER``.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.records.events import Diagnosed
from harness.records.journal import Event, Journal
from harness.records.microscope_file import LOG_EDGES, N_BINS, Microscope, RankSeries

#: The ``step`` event fields exported as scalars ``train/FIELD``, when a step has them.
STEP_FIELDS: tuple[str, ...] = (
    "loss",
    "local_loss",
    "lr",
    "loss_scale",
    "grad_norm",
    "step_time",
    "tokens",
    "batch_tokens",
    "pad_tokens",
    "grad_variance",
    "warmup_factor",
)
#: Journal event kinds exported as text, and the tag each goes under.
TEXT_TAGS: dict[str, str] = {
    "fault_injected": "events/faults",
    "fault_skipped": "events/faults",
    "detected": "events/detections",
    "diagnosed": "events/detections",
    "recovered": "events/recoveries",
    "restart": "events/recoveries",
    "rank_lost": "events/recoveries",
    "checkpoint_rejected": "events/recoveries",
}
#: The most characters of an event's other fields a text shows (the journal keeps them all).
TEXT_CHARS = 600
#: The microscope's per-layer series exported as scalars ``NAME/LAYER``.
LAYER_SERIES: tuple[str, ...] = ("grad_norm", "weight_norm", "update_ratio")

#: Upper limit of each TensorBoard bucket: zeros, the 32 half-decade bins, values >= 1e8.
BUCKET_LIMITS: tuple[float, ...] = (0.0, *(float(e) for e in LOG_EDGES[1:]), 10.0**8.5)
_LOWER_EDGES = np.array([0.0, 0.0, *LOG_EDGES[1:]], dtype=np.float64)
_UPPER_EDGES = np.array(BUCKET_LIMITS, dtype=np.float64)
# A bucket's stand-in value for the estimated sums: 0, each log bin's geometric middle,
# and 1e8 (the least an overflowed value can be).
_MIDDLES = np.array(
    [0.0, *np.sqrt(LOG_EDGES[:-1] * LOG_EDGES[1:]), float(LOG_EDGES[-1])], dtype=np.float64
)


@dataclass(frozen=True, slots=True)
class Scalar:
    """One scalar point."""

    tag: str
    step: int
    wall: float | None
    value: float


@dataclass(frozen=True, slots=True)
class Histogram:
    """One activation histogram, in TensorBoard's terms (see `tensorboard_buckets`)."""

    tag: str
    step: int
    wall: float | None
    min: float
    max: float
    num: int
    sum: float
    sum_squares: float
    bucket_limits: tuple[float, ...]
    bucket_counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Text:
    """One Markdown note at a step."""

    tag: str
    step: int
    wall: float | None
    text: str


Point = Scalar | Histogram | Text


@dataclass(slots=True)
class RankPoints:
    """Every point of one rank, in step order once `sorted_points` is called."""

    rank: int
    points: list[Point] = field(default_factory=list)

    def sorted_points(self) -> list[Point]:
        """The points by step (stable: a step's points keep the order they were made in)."""
        return sorted(self.points, key=lambda p: p.step)


def tensorboard_buckets(
    counts: np.ndarray, tag: str, step: int, wall: float | None
) -> tuple[Histogram | None, int]:
    """One record's bin counts as a TensorBoard histogram (None when no value was finite)
    and the count of non-finite values, which TensorBoard's axis has no place for.

    Only the buckets from the first non-empty one to the last are written (the others are
    empty); ``min`` and ``max`` are their outer edges, ``sum`` and ``sum_squares`` estimates
    from each bucket's middle (the bins keep no exact values).
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape != (N_BINS,):
        raise ValueError(f"{tag}: expected {N_BINS} bin counts, got shape {counts.shape}")
    finite, nonfinite = counts[:-1], int(counts[-1])
    num = int(finite.sum())
    if num == 0:
        return None, nonfinite
    filled = np.flatnonzero(finite)
    # From the first non-empty bucket to the last: TensorBoard takes ``min`` as the lower
    # edge of the first bucket, which an empty zero bucket below it would contradict.
    first, last = int(filled[0]), int(filled[-1]) + 1
    histogram = Histogram(
        tag=tag,
        step=step,
        wall=wall,
        min=float(_LOWER_EDGES[first]),
        max=float(_UPPER_EDGES[last - 1]),
        num=num,
        sum=float((finite * _MIDDLES).sum()),
        sum_squares=float((finite * _MIDDLES**2).sum()),
        bucket_limits=BUCKET_LIMITS[first:last],
        bucket_counts=tuple(int(c) for c in finite[first:last]),
    )
    return histogram, nonfinite


def collect(journal: Journal, microscope: Microscope) -> dict[int, RankPoints]:
    """Every rank's points: the journal's scalars and notes, the microscope's figures."""
    ranks = sorted(set(journal.ranks) | set(microscope.ranks))
    out = {rank: RankPoints(rank) for rank in ranks}
    for rank in ranks:
        points = out[rank].points
        steps = journal.steps(rank)
        points.extend(_step_scalars(steps))
        points.extend(_notes(journal, rank))
        series = microscope.ranks.get(rank)
        if series is not None:
            walls = {s: e.wall for s, e in steps.items()}
            walls.update(zip(series.steps.tolist(), series.wall.tolist(), strict=True))
            points.extend(_microscope_points(series, microscope.layers, walls))
    return out


def _number(value: Any) -> float | None:
    # bool is an int to Python, but `skipped: true` is no figure to plot.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _step_scalars(steps: dict[int, Event]) -> Iterator[Scalar]:
    for step in sorted(steps):
        event = steps[step]
        for name in STEP_FIELDS:
            value = _number(event.get(name))
            if value is not None:  # absent, or null (observed: there is none)
                yield Scalar(f"train/{name}", step, event.wall, value)


def _notes(journal: Journal, rank: int) -> Iterator[Text]:
    # Several events of one kind at one step make one note, so a step has one text per tag.
    grouped: dict[tuple[str, int], list[Event]] = {}
    for event in journal:
        tag = TEXT_TAGS.get(event.kind)
        if tag is not None and event.rank == rank:
            grouped.setdefault((tag, event.step), []).append(event)
    for (tag, step), events in grouped.items():
        text = "\n\n".join(describe(e) for e in events)
        yield Text(tag, step, events[0].wall, text)


def describe(event: Event) -> str:
    """A journal event as one Markdown line: its kind, its main field, the rest as JSON."""
    main = {
        "fault_injected": "fault",
        "fault_skipped": "fault",
        "detected": "detector",
        "recovered": "action",
        "restart": "count",
        "rank_lost": "lost_rank",
        "checkpoint_rejected": "path",
    }.get(event.kind)
    head = f"**{event.kind}**"
    if event.is_(Diagnosed):
        main = "layers"
        layers = ", ".join(str(x) for x in event.get("layers") or []) or "no single layer"
        head += f" `{layers}`"
    elif main is not None and main in event.fields:
        head += f" `{event.fields[main]}`"
    # the short fields first, so a long ``details`` cut short loses none of them
    rest = {k: v for k, v in event.fields.items() if k not in (main, "details")}
    if "details" in event.fields:
        rest["details"] = event.fields["details"]
    tail = json.dumps(rest, default=str) if rest else ""
    if len(tail) > TEXT_CHARS:  # a fault's list of every parameter it hit, say
        tail = f"{tail[:TEXT_CHARS]}... ({len(tail)} characters; the journal has them all)"
    tail = f" {tail}" if tail else ""
    return f"{head}{tail} (step {event.step}, rank {event.rank}, restart {event.restart})"


def _microscope_points(
    series: RankSeries, layers: list[str], walls: dict[int, float]
) -> Iterator[Point]:
    for row, step in enumerate(series.steps.tolist()):
        wall = float(series.wall[row])
        at: float | None = wall if math.isfinite(wall) else walls.get(step)
        for name in LAYER_SERIES:
            values = getattr(series, name)[row]
            for layer, value in zip(layers, values.tolist(), strict=True):
                if not math.isnan(value):  # NaN: not measured; infinities are findings
                    yield Scalar(f"{name}/{layer}", step, at, float(value))
        for layer, counts in zip(layers, series.act_hist[row], strict=True):
            if counts.any():  # all zero: not taken at this record
                histogram, nonfinite = tensorboard_buckets(counts, f"act_hist/{layer}", step, at)
                if histogram is not None:
                    yield histogram
                yield Scalar(f"act_nonfinite/{layer}", step, at, float(nonfinite))
        allreduce = float(series.allreduce_ms[row])
        if not math.isnan(allreduce):
            yield Scalar("comm/allreduce_ms", step, at, allreduce)
    known = sorted(walls)
    for step, peer, round_trip_us in series.probes:
        near = _wall_near(walls, known, step)
        yield Scalar(f"comm/p2p_us/rank-{peer}", step, near, round_trip_us)


def _wall_near(walls: dict[int, float], known: list[int], step: int) -> float | None:
    # A probe has no clock of its own: the wall time of its step, or of the last step
    # before it that has one (the first one after, for a probe before every record).
    if not known:
        return None
    i = bisect.bisect_right(known, step)
    return walls[known[i - 1] if i else known[0]]
