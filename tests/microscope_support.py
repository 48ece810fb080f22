"""Synthetic runs with microscope records, for the scorecard's microscope tests."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from harness.records.journal import JournalWriter
from harness.records.microscope_file import (
    WHY_AFTER,
    WHY_ANOMALY,
    WHY_BEFORE,
    WHY_PERIODIC,
    MicroscopeWriter,
    Record,
    histogram,
)

LAYERS = ["embedding", "blocks.0", "blocks.1", "blocks.2", "ln_f"]
HOT_LAYER = "blocks.1"
BLOW_UP_STEP = 30
BLOW_UP_NORM = 1e5
#: rank -> peer -> median round trip in µs the synthetic probes report.
LATENCY_US = {0: {1: 42.0}, 1: {0: 87.5}}
ALLREDUCE_MS = {0: 3.0, 1: 11.0}


def _why(step: int, anomaly: int | None) -> int:
    if anomaly is None:
        return WHY_PERIODIC if step % 5 == 0 else 0
    if step == anomaly:
        return WHY_ANOMALY
    if anomaly - 3 <= step < anomaly:
        return WHY_BEFORE
    if anomaly < step <= anomaly + 3:
        return WHY_AFTER
    return WHY_PERIODIC if step % 5 == 0 else 0


def write_microscope(
    run_dir: Path,
    *,
    ranks: int = 1,
    steps: int = 60,
    anomaly: int | None = BLOW_UP_STEP,
    hot_layer: str = HOT_LAYER,
    blow_up_norm: float = BLOW_UP_NORM,
    layers: list[str] = LAYERS,
) -> None:
    """Records every 5 steps and around ``anomaly``, where ``hot_layer``'s gradient norm is
    ``blow_up_norm`` and its activations overflow (1e9) and go non-finite."""
    rng = np.random.default_rng(0)
    hot = layers.index(hot_layer)
    for rank in range(ranks):
        writer = MicroscopeWriter(run_dir, rank=rank, restart=0, layers=layers, chunk_records=7)
        for step in range(1, steps + 1):
            why = _why(step, anomaly)
            if not why:
                continue
            grad = np.array([0.5 + 0.1 * k + 0.01 * step for k in range(len(layers))])
            hist = np.stack([histogram(rng.lognormal(0.0, 1.0, 400)) for _ in layers])
            if step == anomaly:
                grad[hot] = blow_up_norm
                acts = np.concatenate([rng.lognormal(0.0, 1.0, 380), np.full(15, 1e9)])
                hist[hot] = histogram(np.concatenate([acts, [math.inf] * 3, [math.nan] * 2]))
            writer.add(
                Record(
                    step=step,
                    why=why,
                    wall=1000.0 + step,
                    grad_norm=grad.astype(np.float32),
                    weight_norm=np.full(len(layers), 10.0, dtype=np.float32),
                    update_ratio=np.full(len(layers), 1e-3 * (1 + step / 60), dtype=np.float32),
                    act_hist=hist,
                    allreduce_ms=ALLREDUCE_MS[rank] if ranks > 1 else math.nan,
                )
            )
            if ranks > 1 and step % 10 == 0:
                for peer, us in LATENCY_US[rank].items():
                    writer.add_probe(step, peer, us)
        writer.flush()


def write_journal(
    run_dir: Path,
    *,
    steps: int = 60,
    fault_at: int | None = BLOW_UP_STEP,
    fault_rank: int = 0,
    diagnosed: list[str] | None = None,
    diagnosed_at: int = BLOW_UP_STEP,
    resume_at: int | None = None,
) -> None:
    """Rank 0's steps, a fault on ``fault_rank`` at ``fault_at`` (detected, recovered), and,
    when ``diagnosed`` is given, the trainer's diagnosis naming those layers."""
    with JournalWriter(run_dir) as w:
        w.emit("run_start", 0, world_size=1, pid=1, host="test", target_steps=steps)
        for step in range(1, steps + 1):
            if step == resume_at:
                w.emit("run_start", step, world_size=1, pid=2, host="test", target_steps=steps)
            if step == fault_at:
                w.emit("detected", step, detector="grad_spike")
                w.emit("recovered", step, action="skip_step")
            if step == diagnosed_at and diagnosed is not None:
                w.emit("diagnosed", step, detectors=["grad_spike"], layers=diagnosed)
            w.emit("step", step, loss=3.0 - step / 100, grad_norm=1.0)
        w.emit("run_end", steps, status="completed", seconds=1.0)
    if fault_at is not None:
        with JournalWriter(run_dir, rank=fault_rank) as w:
            w.emit("fault_injected", fault_at, fault="grad_spike", target=HOT_LAYER)
