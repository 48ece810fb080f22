"""The microscope's files: what is written is read back; damage and newer formats are named."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from harness.records.microscope_file import (
    BIN_LABELS,
    FORMAT,
    N_BINS,
    WHY_PERIODIC,
    MicroscopeFileError,
    MicroscopeWriter,
    Record,
    bytes_on_disk,
    histogram,
    read_microscope,
)
from harness.run_layout import RunLayout


def record(step: int, layers: int, grad: float = 1.0) -> Record:
    """A record whose gradient norms are ``grad`` and whose histogram holds ``step`` ones."""
    hist = np.zeros((layers, N_BINS), dtype=np.int64)
    hist[:, 17] = step  # the [1e+0.0, 1e+0.5) bin
    return Record(
        step=step,
        why=WHY_PERIODIC,
        wall=time.time(),
        grad_norm=np.full(layers, grad, np.float32),
        weight_norm=np.ones(layers, np.float32),
        update_ratio=np.full(layers, 0.01, np.float32),
        act_hist=hist,
        allreduce_ms=2.5,
    )


def test_records_and_probes_are_read_back_per_rank(tmp_path: Path) -> None:
    writer = MicroscopeWriter(tmp_path, rank=0, restart=0, layers=["a", "b"], chunk_records=2)
    for step in (10, 20, 30):
        writer.add(record(step, 2, grad=step / 10))
    writer.add_probe(30, 1, 150.0)
    writer.flush()
    other = MicroscopeWriter(tmp_path, rank=1, restart=0, layers=["a", "b"])
    other.add(record(10, 2))
    other.add_probe(30, 0, 170.0)
    other.flush()
    scope = read_microscope(tmp_path)
    assert scope.layers == ["a", "b"] and sorted(scope.ranks) == [0, 1]
    zero = scope.ranks[0]
    assert zero.steps.tolist() == [10, 20, 30]
    assert zero.grad_norm[:, 1].tolist() == [1.0, 2.0, 3.0]
    assert zero.act_hist[2, 0, 17] == 30 and BIN_LABELS[17] == "[1e+0.0,1e+0.5)"
    assert zero.allreduce_ms.tolist() == [2.5] * 3
    ranks, matrix = scope.latency_matrix()
    assert ranks == [0, 1] and matrix[0, 1] == 150.0 and matrix[1, 0] == 170.0
    assert np.isnan(matrix[0, 0])
    assert bytes_on_disk(tmp_path) == sum(
        p.stat().st_size for p in RunLayout(tmp_path).microscope.rglob("*.npz")
    )


def test_a_step_recorded_again_after_a_restart_keeps_its_last_record(tmp_path: Path) -> None:
    first = MicroscopeWriter(tmp_path, rank=0, restart=0, layers=["a"])
    first.add(record(10, 1, grad=1.0))
    first.add(record(20, 1, grad=2.0))
    first.flush()
    again = MicroscopeWriter(tmp_path, rank=0, restart=1, layers=["a", "new"])
    again.add(record(20, 2, grad=5.0))
    again.flush()
    series = read_microscope(tmp_path).ranks[0]
    assert series.steps.tolist() == [10, 20] and series.restart.tolist() == [0, 1]
    assert series.grad_norm[:, 0].tolist() == [1.0, 5.0]
    assert np.isnan(series.grad_norm[0, 1])  # a layer its chunk did not have: not measured


def test_a_damaged_chunk_is_skipped_with_a_warning_naming_it(tmp_path: Path) -> None:
    writer = MicroscopeWriter(tmp_path, rank=0, restart=0, layers=["a"], chunk_records=1)
    writer.add(record(10, 1))
    writer.add(record(20, 1))
    damaged = sorted(RunLayout(tmp_path).microscope_rank(0).glob("*.npz"))[1]
    damaged.write_bytes(damaged.read_bytes()[:40])
    with pytest.warns(UserWarning, match=damaged.name):
        scope = read_microscope(tmp_path)
    assert scope.ranks[0].steps.tolist() == [10] and len(scope.skipped) == 1


def test_pickled_objects_in_a_chunk_are_refused_unread(tmp_path: Path) -> None:
    folder = RunLayout(tmp_path).microscope_rank(0)
    folder.mkdir(parents=True)
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (marker.touch, ())  # type: ignore[return-value]

    np.savez(folder / "00-00000.npz", format=np.array(FORMAT), layers=np.array([Payload()]))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        scope = read_microscope(tmp_path)
    assert not scope and not marker.exists() and "pickled" in str(seen[0].message).lower()


def test_a_newer_format_is_refused(tmp_path: Path) -> None:
    folder = RunLayout(tmp_path).microscope_rank(0)
    folder.mkdir(parents=True)
    np.savez(folder / "00-00000.npz", format=np.array(FORMAT + 1))
    with pytest.raises(MicroscopeFileError, match="newer"):
        read_microscope(tmp_path)


def test_a_rank_stops_recording_at_its_byte_budget(tmp_path: Path) -> None:
    writer = MicroscopeWriter(
        tmp_path, rank=0, restart=0, layers=["a"], chunk_records=1, max_bytes=2000
    )
    for step in range(1, 50):
        writer.add(record(step, 1))
    assert writer.full and bytes_on_disk(tmp_path) < 2000 + 2 * 1500
    assert len(read_microscope(tmp_path).ranks[0]) < 10


def test_the_fixed_bins_hold_zeros_overflow_and_non_finite_values_apart() -> None:
    values = np.array([0.0, 1e-12, 1e-8, 3.0, 1e7, 1e9, np.inf, -np.inf, np.nan], np.float32)
    counts = histogram(values)
    assert counts.sum() == len(values)
    assert counts[0] == 1 and counts[1] == 2  # zero; anything below 10**-7.5 but not zero
    assert counts[BIN_LABELS.index("[1e+0.0,1e+0.5)")] == 1
    assert counts[BIN_LABELS.index(">=1e+8")] == 1 and counts[-1] == 3
