"""Synthetic runs for the oracle tests: a test tells the story, `Run` journals it.

Events are written in the order the test calls for them, so their wall times follow that
order, as they would in a real run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.oracles.verdict import Evidence
from harness.records.journal import JournalWriter, read_journal

TARGET = 30


def loss_at(step: int) -> float:
    """A gently falling loss curve."""
    return 5.0 - 0.02 * step


class Run:
    """Writes one synthetic run's journal under ``run_dir``, every rank alike."""

    def __init__(self, run_dir: Path, world_size: int = 1, target: int = TARGET) -> None:
        self.run_dir = run_dir
        self.world_size = world_size
        self.target = target
        self.restart_count = 0
        self._writers: dict[int, JournalWriter] = {}
        self._open()

    def _open(self) -> None:
        self.close()
        self._writers = {
            r: JournalWriter(self.run_dir, r, self.restart_count) for r in range(self.world_size)
        }
        for w in self._writers.values():
            w.emit("run_start", 0, world_size=self.world_size, pid=1, host="h")

    def emit(self, kind: str, step: int, rank: int = 0, **fields: Any) -> Run:
        """One event on one rank."""
        self._writers[rank].emit(kind, step, **fields)
        return self

    def step(self, step: int, loss: float | None = None, **fields: Any) -> Run:
        """Step ``step`` on every rank (the loss curve's value unless given)."""
        for w in self._writers.values():
            w.emit("step", step, loss=loss_at(step) if loss is None else loss, **fields)
        return self

    def steps(self, first: int, last: int, **fields: Any) -> Run:
        """Steps ``first`` to ``last`` inclusive, all alike."""
        for s in range(first, last + 1):
            self.step(s, **fields)
        return self

    def fault(self, step: int, kind: str = "nan_grad", target: str = "*", **details: Any) -> Run:
        """A fault injected on rank 0 before step ``step``."""
        return self.emit("fault_injected", step, fault=kind, target=target, details=details)

    def detect(self, step: int, detector: str = "nonfinite_guard", rank: int = 0) -> Run:
        """A detector's claim."""
        return self.emit("detected", step, rank, detector=detector)

    def rollback(self, step: int, to: int) -> Run:
        """Every rank loads the checkpoint of step ``to`` and resumes after it."""
        path = str(self.run_dir / "checkpoints" / f"step-{to:08d}")
        for w in self._writers.values():
            w.emit("checkpoint_loaded", step, path=path)
            w.emit("recovered", step, action="rollback", details={"resumed_at": to})
        return self

    def restart(self, resume_at: int) -> Run:
        """The launcher restarts every worker; they resume from the checkpoint of a step."""
        self.restart_count += 1
        self._open()
        path = str(self.run_dir / "checkpoints" / f"step-{resume_at:08d}")
        for w in self._writers.values():
            w.emit("restart", 0, count=self.restart_count)
            w.emit("checkpoint_loaded", resume_at, path=path)
        return self

    def end(self, status: str = "completed", step: int | None = None, **fields: Any) -> Run:
        """Every rank writes run_end."""
        for w in self._writers.values():
            w.emit("run_end", self.target if step is None else step, status=status, **fields)
        return self

    def close(self) -> None:
        """Close every rank's journal."""
        for w in self._writers.values():
            w.close()

    def evidence(self, baseline: Run | None = None, exit_code: int | None = 0) -> Evidence:
        """What the oracles judge: this run's journal, and a baseline's when given."""
        self.close()
        if baseline is not None:
            baseline.close()
        return Evidence(
            journal=read_journal(self.run_dir),
            run_dir=self.run_dir,
            target_steps=self.target,
            exit_code=exit_code,
            baseline=read_journal(baseline.run_dir) if baseline else None,
        )


def clean_run(run_dir: Path, **fields: Any) -> Run:
    """A fault-free run to the target, finished; ``fields`` go into every step."""
    fields.setdefault("params_finite", True)
    return Run(run_dir).steps(1, TARGET, **fields).end()


def nan_grad_run(run_dir: Path, at: int = 15) -> Run:
    """A NaN gradient at step ``at`` caught by the guard, the step skipped, training on."""
    run = Run(run_dir).steps(1, at - 1, params_finite=True).fault(at)
    run.step(at, skipped=True, params_finite=True).detect(at)
    return run.steps(at + 1, TARGET, params_finite=True).end()
