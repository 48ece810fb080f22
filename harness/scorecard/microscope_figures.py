"""What the scorecard's microscope views show, as plain arrays: no drawing here.

The journal gives the marks (faults, recoveries, the trainer's diagnoses) and the rank to
show; the microscope gives the per-layer figures. The heatmap's columns are the recorded
steps, evenly spaced (the records are dense around an anomaly and sparse elsewhere, so a
step axis would squeeze the anomaly into a hairline); a long run's records are grouped
into at most ``MAX_COLUMNS`` columns, each keeping its group's largest value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from harness.records.event_base import Reported
from harness.records.events import (
    CheckpointLoaded,
    Diagnosed,
    FaultInjected,
    Recovered,
    Restart,
    RunStart,
)
from harness.records.journal import Journal
from harness.records.microscope_file import (
    WHY_AFTER,
    WHY_ANOMALY,
    WHY_BEFORE,
    Microscope,
    RankSeries,
)
from harness.records.step_events import StepObserved

#: Most heatmap columns; beyond it consecutive records are grouped (max per group).
MAX_COLUMNS = 200
#: Most curves in one ridgeline panel.
MAX_CURVES = 12
#: Periodic records shown when no anomaly was recorded.
PERIODIC_CURVES = 5
WINDOW = WHY_BEFORE | WHY_ANOMALY | WHY_AFTER


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """One ``diagnosed`` event: the trainer's claim, not a verdict."""

    step: int
    rank: int
    layers: list[str]
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class Marks:
    """The journal's events the heatmap marks, by step."""

    faults: list[tuple[int, int]] = field(default_factory=list)  # (step, rank)
    recoveries: list[int] = field(default_factory=list)
    diagnoses: list[Diagnosis] = field(default_factory=list)


RECOVERY_KINDS: tuple[type[Reported], ...] = (Recovered, Restart, CheckpointLoaded, RunStart)


def _recoveries(journal: Journal) -> list[int]:
    """Steps of recoveries, restarts and resumes, each where training went on from.

    A restarted process journals its ``run_start``, ``restart`` and ``checkpoint_loaded``
    before it knows its step (they carry step 0); those are placed just before the next
    step that rank journals (the checkpoint's step). A rank's first ``run_start`` is no
    recovery.
    """
    steps: set[int] = set()
    stepped: set[int] = set()  # ranks that journaled a step already
    pending: set[int] = set()  # ranks with a recovery not placed yet
    for e in journal:
        if e.is_(StepObserved):
            if e.rank in pending:
                pending.discard(e.rank)
                steps.add(max(e.step - 1, 0))
            stepped.add(e.rank)
        elif e.is_(*RECOVERY_KINDS):
            if e.is_(RunStart) and e.rank not in stepped and e.step == 0:
                continue
            if e.step == 0 and e.rank in stepped:
                pending.add(e.rank)
            else:
                steps.add(e.step)
    if pending:  # never followed by a step: where they were written
        steps.add(0)
    return sorted(steps)


def marks_from_journal(journal: Journal) -> Marks:
    """Faults injected (with the rank they hit), recoveries and restarts, diagnoses."""
    faults = sorted({(e.step, e.rank) for e in journal if e.is_(FaultInjected)})
    diagnoses = [
        Diagnosis(
            step=e.step,
            rank=e.rank,
            layers=[str(x) for x in e.get("layers") or [] if isinstance(x, str)],
            rule=e.get("rule") if isinstance(e.get("rule"), str) else None,
        )
        for e in journal
        if e.is_(Diagnosed)
    ]
    return Marks(faults=faults, recoveries=_recoveries(journal), diagnoses=diagnoses)


def pick_rank(microscope: Microscope, marks: Marks) -> int:
    """The rank the first fault hit when it has records, else rank 0, else the lowest."""
    recorded = sorted(r for r, s in microscope.ranks.items() if len(s))
    for _step, rank in marks.faults:
        if rank in recorded:
            return rank
    return 0 if 0 in recorded else recorded[0]


@dataclass(frozen=True, slots=True)
class Grid:
    """Layers x columns of one per-layer figure; a column is one or more records."""

    values: np.ndarray  # float [L, C]: NaN blank (not measured), inf drawn as non-finite
    first: np.ndarray  # int [C]: first step of each column
    last: np.ndarray  # int [C]: last step of each column
    group: int  # records per column (1: one column per recorded step)

    def x_of(self, step: float) -> float:
        """Where ``step`` falls on the column axis (column i spans i - 0.5 .. i + 0.5)."""
        n = len(self.first)
        if n == 0:
            return 0.0
        for i in range(n):
            if self.first[i] <= step <= self.last[i]:
                return float(i)
        # Between columns (a step that was not recorded): on the boundary between them.
        after = int(np.searchsorted(self.first, step))
        return after - 0.5


def _column_max(block: np.ndarray) -> np.ndarray:
    """Largest value per row over a group of columns; inf wins, all-NaN stays NaN."""
    out = np.full(block.shape[0], np.nan)
    for row in range(block.shape[0]):
        values = block[row]
        if np.isinf(values).any():
            out[row] = math.inf
        elif np.isfinite(values).any():
            out[row] = float(np.nanmax(values))
    return out


def grid(series: RankSeries, name: str, max_columns: int = MAX_COLUMNS) -> Grid:
    """The per-layer figure ``name`` (grad_norm, update_ratio) as a heatmap grid."""
    data = np.asarray(getattr(series, name), dtype=np.float64)  # [n, L]
    # A NaN is "not measured" and zero has no place on a log scale: both are left blank.
    data = np.where(data == 0, np.nan, np.abs(data))
    n = len(series.steps)
    group = max(1, math.ceil(n / max_columns))
    columns = [_column_max(data[i : i + group].T) for i in range(0, n, group)]
    values = np.stack(columns, axis=1) if columns else np.empty((data.shape[1], 0))
    steps = series.steps
    first = np.array([steps[i] for i in range(0, n, group)], dtype=np.int64)
    last = np.array([steps[min(i + group, n) - 1] for i in range(0, n, group)], dtype=np.int64)
    return Grid(values=values, first=first, last=last, group=group)


def diagnosed_rows(layers: list[str], diagnoses: list[Diagnosis]) -> dict[int, Diagnosis]:
    """Heatmap row -> the first diagnosis naming its layer (or a module it is part of)."""
    rows: dict[int, Diagnosis] = {}
    for diagnosis in diagnoses:
        for named in diagnosis.layers:
            for row, layer in enumerate(layers):
                if (layer == named or layer.startswith(named + ".")) and row not in rows:
                    rows[row] = diagnosis
    return rows


def ridge_records(series: RankSeries) -> tuple[list[int], bool]:
    """Rows of ``series`` the ridgelines show, and whether they surround an anomaly.

    The anomaly window's records (before, anomaly, after) when there are any, centred on
    the first anomaly when there are more than ``MAX_CURVES``; else a few periodic records
    spread over the run. Records whose histograms were not taken are left out.
    """
    taken = series.act_hist.sum(axis=(1, 2)) > 0
    window = [i for i in range(len(series)) if series.why[i] & WINDOW and taken[i]]
    if window:
        if len(window) > MAX_CURVES:
            anomalies = [i for i in window if series.why[i] & WHY_ANOMALY] or window[:1]
            at = window.index(anomalies[0])
            start = max(0, min(at - MAX_CURVES // 2, len(window) - MAX_CURVES))
            window = window[start : start + MAX_CURVES]
        return window, True
    periodic = [i for i in range(len(series)) if taken[i]]
    if len(periodic) > PERIODIC_CURVES:
        picks = np.linspace(0, len(periodic) - 1, PERIODIC_CURVES).round().astype(int)
        periodic = [periodic[int(p)] for p in sorted(set(picks.tolist()))]
    return periodic, False


def allreduce_rows(microscope: Microscope) -> list[tuple[int, int, float, float]]:
    """Per rank: records with an all-reduce time, its median and p95 (ms)."""
    rows = []
    for rank, series in sorted(microscope.ranks.items()):
        ms = np.asarray(series.allreduce_ms, dtype=np.float64)
        ms = ms[np.isfinite(ms)]
        if ms.size:
            rows.append((rank, int(ms.size), float(np.median(ms)), float(np.percentile(ms, 95))))
        else:
            rows.append((rank, 0, math.nan, math.nan))
    return rows
