"""Run a sweep: every cell times every seed through the suite runner, in parallel within the
cores, each finished run cached by its key so that a stopped sweep goes on where it ended.

A run is the sweep's scenario with the cell's settings and the seed (`Sweep.run_scenario`),
run and judged exactly as a suite's scenario (its fault-free baseline first when a check
needs one, cached too). Its record is the scenario's result plus two figures read from its
journal: the final loss and the steps lost. Records are kept in
``CACHE/sweep-runs/<key>.json``, where the key is the baseline's (configuration and code)
with the faults and checks (`harness.running.baseline.scenario_key`); a run with a record
is not run again, unless ``use_cache`` is off.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness import __version__
from harness.errors import JournalError
from harness.oracles.health import final_loss
from harness.records.events import StepObserved
from harness.records.journal import json_safe, read_journal
from harness.records.timeline import surviving_losses
from harness.running.baseline import BASELINE_STOPPED, default_cache_dir, scenario_key
from harness.running.executor import CLUSTER_ERROR, Executor
from harness.running.launch import check_command
from harness.running.progress import SuiteProgress
from harness.running.results import ScenarioResult
from harness.running.runner import INTERRUPTED, Runner, RunOptions, wait_or_stop
from harness.soak.measures import measure
from harness.suites.scenario import Scenario
from harness.sweeps.sweep_file import Cell, Sweep

#: Where run records are cached, under the cache dir.
RECORDS = "sweep-runs"


@dataclass(slots=True)
class SweepOptions:
    """Where a sweep's runs go and how many run at once."""

    out_dir: Path
    #: Cores to fill: a run of W ranks takes W of them while it runs.
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    cache_dir: Path = field(default_factory=default_cache_dir)
    use_cache: bool = True
    progress: bool = True
    #: Set to stop: running launches are killed, runs not begun are not run.
    stop: threading.Event = field(default_factory=threading.Event)
    #: Where runs execute; None: this machine, within ``cores``.
    executor: Executor | None = None


@dataclass(slots=True)
class RunRecord:
    """One run of one cell: its result and figures, and whether a record was reused."""

    cell: int
    seed: int
    key: str
    result: ScenarioResult
    final_loss: float | None
    steps_lost: int | None
    #: Where the run's files are (absolute; a reused record names the sweep that ran it).
    run_dir: str
    cached: bool = False

    @property
    def passed(self) -> bool:
        """Every check of the run passed."""
        return self.result.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the record file and sweep.json."""
        return {
            "cell": self.cell,
            "seed": self.seed,
            "key": self.key,
            "status": self.result.status,
            "final_loss": self.final_loss,
            "steps_lost": self.steps_lost,
            "run_seconds": self.result.run_seconds,
            "run_dir": self.run_dir,
            "cached": self.cached,
            "result": self.result.to_dict(),
        }


@dataclass(slots=True)
class SweepRun:
    """What a sweep run came to: one record per (cell, seed) that finished (all of them
    unless it was interrupted)."""

    sweep: Sweep
    records: list[RunRecord]
    started: str
    seconds: float
    interrupted: bool = False
    version: str = __version__

    @property
    def complete(self) -> bool:
        """Every run of every cell has a record."""
        return len(self.records) == self.sweep.runs

    def of_cell(self, cell: Cell) -> list[RunRecord]:
        """The cell's records, by seed."""
        return sorted((r for r in self.records if r.cell == cell.index), key=lambda r: r.seed)


def figures(run_dir: Path, result: ScenarioResult) -> tuple[float | None, int | None]:
    """The run's final loss (mean of rank 0's last surviving losses) and steps lost."""
    try:
        journal = read_journal(run_dir, warn=False)
    except JournalError:
        return None, None
    if not journal.of_kind(StepObserved):
        return None, None
    loss = final_loss(surviving_losses(journal))
    return loss, measure(journal, result.run_seconds or 0.0).steps_lost


def _record_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / RECORDS / f"{key}.json"


def _load_record(path: Path, cell: Cell, seed: int) -> RunRecord | None:
    """A cached record, or None when there is none or it cannot be read (it is rerun)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        result = ScenarioResult.from_dict(data["result"])
        return RunRecord(
            cell=cell.index,
            seed=seed,
            key=str(data["key"]),
            result=result,
            final_loss=_float(data.get("final_loss")),
            steps_lost=data.get("steps_lost"),
            run_dir=str(data.get("run_dir", "")),
            cached=True,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _float(value: Any) -> float | None:
    if value is None:
        return None
    return float(value)  # "inf"/"nan" strings of json_safe read back as floats


def _save_record(path: Path, record: RunRecord) -> None:
    """Written aside and renamed into place: a record is whole or absent, even after a kill."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.partial")
    partial.write_text(json.dumps(json_safe(record.to_dict()), allow_nan=False, default=str))
    partial.replace(path)


def _keep(result: ScenarioResult) -> bool:
    """Whether a run's outcome is the configuration's (a stopped run, the harness's own
    failure or a cluster's is not, and is run again next time)."""
    error = result.error or ""
    return not (_stopped(result) or error.startswith(("harness error:", CLUSTER_ERROR)))


def _stopped(result: ScenarioResult) -> bool:
    """The run, or the fault-free baseline it waited for, was stopped by the user (its
    error may go on to say what was missing)."""
    error = result.error or ""
    return error.startswith(INTERRUPTED) or BASELINE_STOPPED in error


def run_sweep(sweep: Sweep, options: SweepOptions, only: list[Cell] | None = None) -> SweepRun:
    """Run (or reuse) every run of the sweep, or of the cells in ``only``, and gather the
    records."""
    started, clock = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.monotonic()
    cells = sweep.cells() if only is None else only
    jobs: list[tuple[Cell, int, Scenario, str]] = []
    # Seed by seed, every cell at each: a sweep stopped half way has its cells on the same
    # seeds, so what it kept compares them on the same draws.
    for seed in sweep.seeds:
        for cell in cells:
            scenario = sweep.run_scenario(cell, seed)
            jobs.append((cell, seed, scenario, scenario_key(scenario)))
    for trainer in {job[2].trainer.command: job[2].trainer for job in jobs}.values():
        check_command(trainer)  # each distinct command (a grid may sweep it), before any run
    options.out_dir.mkdir(parents=True, exist_ok=True)
    records: list[RunRecord] = []
    todo = []
    for cell, seed, scenario, key in jobs:
        found = (
            _load_record(_record_path(options.cache_dir, key), cell, seed)
            if options.use_cache
            else None
        )
        if found is not None:
            records.append(found)
        else:
            todo.append((cell, seed, scenario, key))
    done_per_cell = {c.index: 0 for c in cells}
    for r in records:
        done_per_cell[r.cell] += 1
    lock = threading.Lock()
    display = SuiteProgress(len(todo), _title(sweep, done_per_cell)) if options.progress else None
    runner = Runner(
        RunOptions(
            out_dir=options.out_dir,
            cores=options.cores,
            cache_dir=options.cache_dir,
            use_cache=options.use_cache,
            stop=options.stop,
            executor=options.executor,
        ),
        display,
    )

    def one(cell: Cell, seed: int, scenario: Scenario, key: str) -> None:
        result = runner.scenario(scenario)
        run_dir = (options.out_dir / result.run_dir).resolve()
        loss, lost = figures(run_dir, result) if result.error is None else (None, None)
        record = RunRecord(cell.index, seed, key, result, loss, lost, str(run_dir))
        if _keep(result):
            _save_record(_record_path(options.cache_dir, key), record)
        with lock:
            records.append(record)
            done_per_cell[cell.index] += 1
            if display is not None:
                display.retitle(_title(sweep, done_per_cell))

    if display is not None:
        display.__enter__()
    slots = runner.executor.slots(options.cores)
    pool = ThreadPoolExecutor(max_workers=max(1, min(len(todo), slots)))
    futures = [pool.submit(one, *job) for job in todo]
    try:
        interrupted = wait_or_stop(futures, options.stop)
    finally:
        pool.shutdown(wait=True)
        if display is not None:
            display.__exit__(None, None, None)
    for f in futures:
        f.result()  # a surprise in the sweep's own code is raised, not swallowed
    # A stopped run says nothing of its configuration: it is left out (and run next time).
    finished = [r for r in records if not _stopped(r.result)]
    return SweepRun(
        sweep=sweep,
        records=sorted(finished, key=lambda r: (r.cell, r.seed)),
        started=started,
        seconds=time.monotonic() - clock,
        interrupted=interrupted,
    )


def _title(sweep: Sweep, done_per_cell: dict[int, int]) -> str:
    full = sum(n >= len(sweep.seeds) for n in done_per_cell.values())
    return f"sweep {sweep.name}: {full}/{len(done_per_cell)} cells done"
