"""Every path of a run directory, named in one place.

A run directory is shared ground: the reference trainer writes it, the agent journals into
it, faults damage it, the runner and the oracles read it. Each of them asks this module
where a thing lives, so the layout below is written down once::

    RUN_DIR/.lock                      its owner's claim: a flock held for life, PID HOST
                                       (harness/running/run_lock.py)
    RUN_DIR/config.json                the reference trainer's configuration
    RUN_DIR/run-id                     the run's id, bound into every checkpoint manifest
                                       (each written aside first: .config.json.tmp, .run-id.tmp)
    RUN_DIR/tokenizer.json             the tokenizer the run trained
    RUN_DIR/journal/rank-R.jsonl       what each rank saw (docs/journal.md)
    RUN_DIR/checkpoints/               step-NNNNNNNN/ folders and the `latest` hint (their
                                       names: faults/checkpoint_tree.py)
    RUN_DIR/heartbeats/rank-R.json     each rank's last step, for its hang monitor
    RUN_DIR/metrics/rank-R.prom        each rank's OpenMetrics for dashboards (docs/metrics.md)
    RUN_DIR/microscope/rank-R/*.npz    each rank's per-layer figures (docs/journal.md)
    RUN_DIR/control/                   the live-control channel (harness/live/control.py)
    RUN_DIR/diagnosis.md               why recovery gave up, when it did
    RUN_DIR/plan.yaml                  the fault plan the runner handed the trainer
    RUN_DIR/trainer.log                the trainer's output, as the runner captured it
    RUN_DIR/baseline.json              a cached fault-free baseline run is complete
    RUN_DIR/data/review-queue.jsonl    documents the toxicity filter held for review
    RUN_DIR/data/review-decisions.jsonl  accept/reject decisions `tightrope review` recorded
    RUN_DIR/samples.json               generations of the run's final weights (its sampler)
    RUN_DIR/baseline-samples.json      generations of its fault-free baseline's final weights
    RUN_DIR/background.json            a job started in the background (docs/chaostoolkit.md)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, init=False)
class RunLayout:
    """The paths of one run directory."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def lock(self) -> Path:
        """The run dir's owner holds a lock on this file for as long as it lives."""
        return self.root / ".lock"

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def run_id(self) -> Path:
        return self.root / "run-id"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer.json"

    @property
    def journal(self) -> Path:
        return self.root / "journal"

    def journal_file(self, rank: int) -> Path:
        """One rank's journal (every restart of that rank appends to it)."""
        return self.journal / f"rank-{rank}.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    def heartbeat_file(self, rank: int) -> Path:
        """One rank's heartbeat, rewritten after every step."""
        return self.heartbeats / f"rank-{rank}.json"

    @property
    def crashes(self) -> Path:
        return self.root / "crashes"

    def crash_file(self, rank: int, restart: int) -> Path:
        """What ``faulthandler`` wrote when one attempt of a rank died by a fatal signal
        (SIGSEGV, SIGABRT, ...): empty, and removed, when the attempt ended otherwise."""
        return self.crashes / f"rank-{rank}-restart-{restart}.txt"

    @property
    def collectives(self) -> Path:
        return self.root / "collectives"

    def collective_file(self, rank: int) -> Path:
        """How many all-reduces one rank has entered, rewritten as it enters each."""
        return self.collectives / f"rank-{rank}.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    def metrics_file(self, rank: int) -> Path:
        """One rank's OpenMetrics text file, rewritten every few seconds when enabled."""
        return self.metrics / f"rank-{rank}.prom"

    @property
    def microscope(self) -> Path:
        return self.root / "microscope"

    def microscope_rank(self, rank: int) -> Path:
        """One rank's microscope chunks (harness/records/microscope_file.py)."""
        return self.microscope / f"rank-{rank}"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def diagnosis(self) -> Path:
        return self.root / "diagnosis.md"

    @property
    def plan(self) -> Path:
        return self.root / "plan.yaml"

    @property
    def log(self) -> Path:
        return self.root / "trainer.log"

    @property
    def baseline_done(self) -> Path:
        return self.root / "baseline.json"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def review_queue(self) -> Path:
        return self.data / "review-queue.jsonl"

    @property
    def review_decisions(self) -> Path:
        return self.data / "review-decisions.jsonl"

    @property
    def samples(self) -> Path:
        return self.root / "samples.json"

    @property
    def baseline_samples(self) -> Path:
        return self.root / "baseline-samples.json"

    @staticmethod
    def aside(path: Path) -> Path:
        """Where ``path`` is written whole (and fsynced) before it is renamed into place."""
        return path.with_name(f".{path.name}.tmp")

    def start_up_files(self) -> tuple[Path, ...]:
        """What the reference trainer writes once its start-up has begun: a start that never
        finished (no configuration and run id written) may have left any of these, and a
        start over removes them (the runner's plan and log, and the lock, stay)."""
        return (
            self.config,
            self.aside(self.config),
            self.run_id,
            self.aside(self.run_id),
            self.tokenizer,
            self.journal,
            self.checkpoints,
            self.heartbeats,
            self.crashes,
            self.collectives,
            self.metrics,
            self.microscope,
            self.control,
            self.diagnosis,
            self.data,
            self.samples,
        )

    @property
    def background(self) -> Path:
        """The record of a job started in the background: its process and launch mark."""
        return self.root / "background.json"
