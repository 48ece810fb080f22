"""The microscope's files: per-layer and per-rank figures beside the journal (docs/journal.md,
"The microscope").

Each rank writes compressed NumPy chunks, one per few dozen recorded steps::

    RUN_DIR/microscope/rank-R/RR-SSSSS.npz     (restart RR, chunk number SSSSS)

A chunk is written whole to a temporary name and renamed, so a killed process leaves only
whole chunks (and loses at most the records it had not flushed yet). Chunks hold plain
arrays only and are read with ``allow_pickle=False``: their bytes are never unpickled. A
chunk that cannot be read is skipped with a warning naming it.

Arrays of one chunk (``n`` records, ``L`` layers, ``B = len(BIN_LABELS)`` histogram bins):

=================  ===========  ===========================================================
``format``         int          ``FORMAT`` (a newer one is refused)
``layers``         str [L]      layer names, in forward order
``steps``          int64 [n]    the step each record describes
``why``            uint8 [n]    why it was recorded: a sum of the ``WHY_*`` flags
``wall``           float64 [n]  ``time.time()`` when it was recorded
``grad_norm``      float32 [n,L]  L2 norm of the layer's gradients as backward left them
                               (divided by the step's loss scale when it reports one)
``weight_norm``    float32 [n,L]  L2 norm of its weights after the step
``update_ratio``   float32 [n,L]  ``||w_after - w_before|| / ||w_before||``
``act_hist``       int64 [n,L,B]  counts of ``|activation|`` per bin (all zero: not taken)
``allreduce_ms``   float32 [n]  time this rank spent in gradient all-reduces during the step
``probe_steps``    int64 [m]    point-to-point probes: the step it ran before
``probe_peers``    int32 [m]    ... the other rank
``probe_us``       float32 [m]  ... median round trip, microseconds
=================  ===========  ===========================================================

NaN means "not measured at this record"; +inf means the figure is not finite (a layer with a
NaN or infinite gradient has gradient norm +inf: a finding, not a gap). Histogram bins are
fixed, so they compare across steps, ranks and runs: exact zeros, then half-decade bins from
1e-8 to 1e8 (anything smaller but non-zero falls in the first), then finite values of at
least 1e8, then non-finite values. A layer's output of more than 4,096 values is binned on
an evenly strided sample of about that many, unless its largest magnitude is 1e8 or more or
not finite: then every value is, so those two bins always count exactly.
"""

from __future__ import annotations

import itertools
import os
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.run_layout import RunLayout

FORMAT = 1

#: The switch of the recorder (harness/inside/microscope.py): ``on``, ``off`` or options.
MICROSCOPE_ENV = "TIGHTROPE_MICROSCOPE"

WHY_PERIODIC = 1  # every ``every`` steps
WHY_BEFORE = 2  # in the window before an anomaly (kept in memory until one came)
WHY_ANOMALY = 4  # the anomaly's own step
WHY_AFTER = 8  # in the window after an anomaly

#: Edges of the log-spaced bins: 1e-8, 10**-7.5, ..., 1e8.
LOG_EDGES = np.logspace(-8.0, 8.0, 33)
BIN_LABELS: tuple[str, ...] = (
    "0",
    *(f"[1e{np.log10(lo):+.1f},1e{np.log10(hi):+.1f})" for lo, hi in itertools.pairwise(LOG_EDGES)),
    ">=1e+8",
    "nan/inf",
)
N_BINS = len(BIN_LABELS)

_PER_RECORD = ("steps", "why", "wall", "allreduce_ms")
_PER_LAYER = ("grad_norm", "weight_norm", "update_ratio")
_PROBES = ("probe_steps", "probe_peers", "probe_us")


class MicroscopeFileError(ValueError):
    """A microscope chunk of a newer format than this reader knows."""


@dataclass(slots=True)
class Record:
    """One recorded step of one rank, as the recorder hands it to the writer."""

    step: int
    why: int
    wall: float
    grad_norm: np.ndarray  # float32 [L]
    weight_norm: np.ndarray  # float32 [L]
    update_ratio: np.ndarray  # float32 [L]
    act_hist: np.ndarray  # int64 [L, B]
    allreduce_ms: float = float("nan")


class MicroscopeWriter:
    """Buffers one rank's records and writes them as chunks (see the module docstring)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        rank: int,
        restart: int,
        layers: Sequence[str],
        chunk_records: int = 50,
        max_bytes: int = 64 << 20,
    ) -> None:
        self.dir = RunLayout(run_dir).microscope_rank(rank)
        self.restart = restart
        self.layers = list(layers)
        self.chunk_records = chunk_records
        self.max_bytes = max_bytes
        self.bytes_written = 0
        self.full = False  # True once max_bytes was reached: later records are dropped
        self._records: list[Record] = []
        self._probes: list[tuple[int, int, float]] = []
        self._seq = 0
        if self.dir.exists():  # a restart of the same attempt number writes after it
            taken = [p for p in self.dir.glob(f"{restart:02d}-*.npz")]
            self._seq = len(taken)
            self.bytes_written = sum(p.stat().st_size for p in self.dir.glob("*.npz"))

    def add(self, record: Record) -> None:
        """Keep a record; a chunk is written once ``chunk_records`` are waiting."""
        if not self.full:
            self._records.append(record)
            if len(self._records) >= self.chunk_records:
                self.flush()

    def add_probe(self, step: int, peer: int, round_trip_us: float) -> None:
        """Keep a point-to-point probe's result (written with the next chunk)."""
        if not self.full:
            self._probes.append((step, peer, round_trip_us))

    def flush(self) -> Path | None:
        """Write what is waiting as one chunk (nothing when nothing waits)."""
        if not self._records and not self._probes:
            return None
        records, self._records = self._records, []
        probes, self._probes = self._probes, []
        n_layers = len(self.layers)
        arrays: dict[str, np.ndarray] = {
            "format": np.array(FORMAT),
            "layers": np.array(self.layers, dtype=str),
            "steps": np.array([r.step for r in records], dtype=np.int64),
            "why": np.array([r.why for r in records], dtype=np.uint8),
            "wall": np.array([r.wall for r in records], dtype=np.float64),
            "allreduce_ms": np.array([r.allreduce_ms for r in records], dtype=np.float32),
            "act_hist": np.array([r.act_hist for r in records], dtype=np.int64).reshape(
                len(records), n_layers, N_BINS
            ),
            "probe_steps": np.array([p[0] for p in probes], dtype=np.int64),
            "probe_peers": np.array([p[1] for p in probes], dtype=np.int32),
            "probe_us": np.array([p[2] for p in probes], dtype=np.float32),
        }
        for name in _PER_LAYER:
            values = [getattr(r, name) for r in records]
            arrays[name] = np.array(values, dtype=np.float32).reshape(len(records), n_layers)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{self.restart:02d}-{self._seq:05d}.npz"
        self._seq += 1
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as out:
            np.savez_compressed(out, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)
        self.bytes_written += path.stat().st_size
        if self.bytes_written >= self.max_bytes:
            self.full = True
        return path


@dataclass(slots=True)
class RankSeries:
    """Every record of one rank, merged over its chunks and restarts.

    A step recorded again after a restart or rollback keeps its last record (as the
    journal's ``steps()`` does). Arrays are indexed [record, layer(, bin)] with the layers
    of ``Microscope.layers``; a layer a chunk did not have is NaN (or zero counts) there.
    """

    rank: int
    steps: np.ndarray
    why: np.ndarray
    wall: np.ndarray
    restart: np.ndarray
    grad_norm: np.ndarray
    weight_norm: np.ndarray
    update_ratio: np.ndarray
    act_hist: np.ndarray
    allreduce_ms: np.ndarray
    probes: list[tuple[int, int, float]] = field(default_factory=list)  # (step, peer, µs)

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(slots=True)
class Microscope:
    """A run's microscope: the layers and each rank's series."""

    layers: list[str]
    ranks: dict[int, RankSeries]
    skipped: list[str] = field(default_factory=list)  # chunks that could not be read

    def __bool__(self) -> bool:
        return any(len(s) for s in self.ranks.values())

    def latency_matrix(self) -> tuple[list[int], np.ndarray]:
        """Ranks and the median probe round trip (µs) from each rank (row) to each other
        rank (column), over every probe; NaN where none ran (the diagonal too)."""
        ranks = sorted(self.ranks)
        where = {r: i for i, r in enumerate(ranks)}
        samples: dict[tuple[int, int], list[float]] = {}
        for rank, series in self.ranks.items():
            for _step, peer, us in series.probes:
                if peer in where and np.isfinite(us):
                    samples.setdefault((where[rank], where[peer]), []).append(us)
        matrix = np.full((len(ranks), len(ranks)), np.nan)
        for (i, j), values in samples.items():
            matrix[i, j] = float(np.median(values))
        return ranks, matrix


def _chunks(run_dir: Path) -> Iterator[tuple[int, int, Path]]:
    root = RunLayout(run_dir).microscope
    if not root.is_dir():
        return
    for folder in sorted(root.glob("rank-*")):
        try:
            rank = int(folder.name.removeprefix("rank-"))
        except ValueError:
            continue
        for path in sorted(folder.glob("*.npz")):
            restart = path.name.split("-", 1)[0]
            if restart.isdigit():
                yield rank, int(restart), path


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    version = int(arrays["format"])
    if version > FORMAT:
        raise MicroscopeFileError(
            f"{path}: microscope format {version} is newer than this reader's ({FORMAT})"
        )
    return arrays


def read_microscope(run_dir: str | os.PathLike[str], *, warn: bool = True) -> Microscope:
    """Every rank's records of a run (empty when it recorded none); chunks that cannot be
    read are skipped, named in ``skipped`` and, with ``warn``, in a warning."""
    loaded: dict[int, list[tuple[int, dict[str, np.ndarray]]]] = {}
    layers: list[str] = []
    skipped: list[str] = []
    for rank, restart, path in _chunks(Path(run_dir)):
        try:
            arrays = _load(path)
        except MicroscopeFileError:
            raise
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
            skipped.append(f"{path}: {exc}")
            continue
        for name in arrays["layers"].tolist():
            if name not in layers:
                layers.append(str(name))
        loaded.setdefault(rank, []).append((restart, arrays))
    if skipped and warn:
        warnings.warn("skipped unreadable microscope chunks: " + "; ".join(skipped), stacklevel=2)
    series = {rank: _merge(rank, chunks, layers) for rank, chunks in sorted(loaded.items())}
    return Microscope(layers=layers, ranks=series, skipped=skipped)


def _merge(
    rank: int, chunks: list[tuple[int, dict[str, np.ndarray]]], layers: list[str]
) -> RankSeries:
    at = {name: i for i, name in enumerate(layers)}
    rows: dict[int, tuple[int, dict[str, np.ndarray], int, list[int]]] = {}
    probes: list[tuple[int, int, float]] = []
    for restart, arrays in chunks:  # in file order: restart, then chunk number
        columns = [at[str(name)] for name in arrays["layers"].tolist()]
        for i, step in enumerate(arrays["steps"].tolist()):
            rows[int(step)] = (restart, arrays, i, columns)
        probes.extend(
            (int(s), int(p), float(us))
            for s, p, us in zip(
                arrays["probe_steps"], arrays["probe_peers"], arrays["probe_us"], strict=True
            )
        )
    kept = sorted(rows.items())
    n, n_layers = len(kept), len(layers)
    per_layer = {name: np.full((n, n_layers), np.nan, dtype=np.float32) for name in _PER_LAYER}
    hist = np.zeros((n, n_layers, N_BINS), dtype=np.int64)
    steps = np.empty(n, dtype=np.int64)
    why = np.zeros(n, dtype=np.uint8)
    wall = np.full(n, np.nan)
    restarts = np.zeros(n, dtype=np.int64)
    allreduce = np.full(n, np.nan, dtype=np.float32)
    for row, (step, (restart, arrays, i, columns)) in enumerate(kept):
        steps[row] = step
        why[row] = arrays["why"][i]
        wall[row] = arrays["wall"][i]
        restarts[row] = restart
        allreduce[row] = arrays["allreduce_ms"][i]
        for name in _PER_LAYER:
            per_layer[name][row, columns] = arrays[name][i]
        hist[row, columns] = arrays["act_hist"][i]
    return RankSeries(
        rank=rank,
        steps=steps,
        why=why,
        wall=wall,
        restart=restarts,
        act_hist=hist,
        allreduce_ms=allreduce,
        probes=sorted(probes),
        **per_layer,
    )


def bytes_on_disk(run_dir: str | os.PathLike[str]) -> int:
    """What a run's microscope takes on disk."""
    root = RunLayout(run_dir).microscope
    return sum(p.stat().st_size for p in root.rglob("*.npz")) if root.is_dir() else 0


def histogram(values: np.ndarray) -> np.ndarray:
    """Counts of ``|values|`` in the fixed bins (NumPy, every value; the recorder bins a
    torch sample the same way, harness/inside/layer_figures.py)."""
    x = np.abs(np.asarray(values, dtype=np.float32).ravel())
    with np.errstate(divide="ignore", invalid="ignore"):
        index = np.clip(np.floor(np.log10(x) * 2.0 + 17.0), 1.0, 33.0)
    index = np.where(x == 0, 0.0, index)
    index = np.where(np.isfinite(x), index, float(N_BINS - 1))
    return np.bincount(index.astype(np.int64), minlength=N_BINS).astype(np.int64)
