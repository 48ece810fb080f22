"""A synthetic run directory for the checklist tests: a journal, a heartbeat and one
microscope chunk, with exactly known evidence (no trainer runs)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from harness.records.journal import JournalWriter
from harness.records.microscope_file import MicroscopeWriter, Record, histogram
from harness.run_layout import RunLayout

#: What the synthetic run of `write_run` emits, by hand from the events and files it writes.
EMITTED = {
    "world-size",  # run_start.world_size
    "training-loss",  # step.loss
    "global-grad-norm",  # step.grad_norm
    "learning-rate",  # step.lr
    "nonfinite-step-guard",  # detected[detector=nonfinite_guard]
    "checkpoint-saved",  # checkpoint_saved
    "layer-grad-norm",  # layer_stats ... grad_norm, and microscope.grad_norm
    "activation-max",  # layer_stats ... act_max
    "run-end-status",  # run_end.status
    "heartbeats",  # heartbeats/rank-0.json
    "update-ratio",  # microscope.update_ratio
    "activation-histogram",  # microscope.act_hist
}


def write_run(run_dir: Path, omit: frozenset[str] = frozenset()) -> None:
    """A small run: rank 0's journal, a heartbeat and one microscope chunk; ``omit`` leaves
    out the named piece (an event kind, ``act_max``, ``heartbeat`` or ``act_hist``)."""
    with JournalWriter(run_dir) as w:
        w.emit("run_start", 0, world_size=1, pid=1, host="test", target_steps=3)
        for step in (1, 2, 3):
            w.emit("step", step, loss=5.0 - step / 10, grad_norm=1.0, lr=1e-3)
        if "detected" not in omit:
            w.emit("detected", 2, detector="nonfinite_guard")
        # Another detector's claim is not the guard's, and a null figure is not a figure.
        w.emit("detected", 2, detector="some_other_detector")
        act_max = None if "act_max" in omit else 3.5
        w.emit("layer_stats", 2, layers={"blocks.0": {"grad_norm": 0.5, "act_max": act_max}})
        w.emit("checkpoint_saved", 3, path=str(run_dir / "checkpoints" / "step-00000003"))
        w.emit("run_end", 3, status="completed")
    if "heartbeat" not in omit:
        beat = RunLayout(run_dir).heartbeat_file(0)
        beat.parent.mkdir(parents=True)
        beat.write_text('{"step": 3}')
    layers = ["embedding", "blocks.0"]
    writer = MicroscopeWriter(run_dir, rank=0, restart=0, layers=layers)
    hist = np.zeros((2, len(histogram(np.zeros(1)))), dtype=np.int64)
    if "act_hist" not in omit:
        hist = np.stack([histogram(np.array([0.1, 2.0, 0.0])) for _ in layers])
    nan = np.full(2, np.nan, dtype=np.float32)
    writer.add(
        Record(
            step=2,
            why=1,
            wall=1.0,
            grad_norm=np.array([0.3, 0.5], dtype=np.float32),
            weight_norm=nan,  # not measured at this record
            update_ratio=np.array([1e-3, np.nan], dtype=np.float32),
            act_hist=hist,
            allreduce_ms=math.nan,  # one rank: no all-reduce
        )
    )
    writer.flush()
