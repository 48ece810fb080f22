"""Sweep files under pytest: ``pytest scenarios/sweeps/beta2.yaml`` collects a file with a
top-level ``sweep:`` key as one item per cell of its grid.

An item runs its cell's seeds (finished runs reused from the cache, as ``tightrope sweep``
does) and fails when the cell's success rate is below the file's ``min_success``, or, in
a file that sets none, when a run could not be judged at all (crashed before training,
timed out). The reports are written again after each cell, to
``--tightrope-scorecard DIR``/sweep-NAME (a temporary folder without the option), so they
hold every cell run so far.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from harness.sweeps.run_sweep import RunRecord
    from harness.sweeps.summary import CellSummary
    from harness.sweeps.sweep_file import Cell, Sweep

SWEEP_MARK = re.compile(rb"^sweep\s*:", re.MULTILINE)


class SweepFile(pytest.File):
    """One sweep file; its cells are the items."""

    def collect(self) -> Any:
        """Validate the whole file, then yield one item per cell."""
        from harness.sweeps.sweep_file import load_sweep

        sweep = load_sweep(self.path)  # a SweepError is shown as a collection error
        self.sweep_name = sweep.name
        self.records: list[RunRecord] = []
        for cell in sweep.cells():
            yield SweepCellItem.from_parent(self, name=cell.slug, sweep=sweep, cell=cell)

    @functools.cached_property
    def out_dir(self) -> Path:
        """Made at the first cell run: a session that runs none leaves no folder behind."""
        scorecard = self.config.getoption("tightrope_scorecard")
        root = scorecard or Path(tempfile.mkdtemp(prefix="tightrope-sweep-"))
        return Path(root) / f"sweep-{self.sweep_name}"


class CellFailed(Exception):
    """A cell's success rate was below the sweep's bar, or a run could not be judged."""

    def __init__(self, summary: CellSummary, why: str) -> None:
        super().__init__(why)
        self.summary = summary


class SweepCellItem(pytest.Item):
    """One cell of a sweep: its seeds run and judged."""

    def __init__(self, *, sweep: Sweep, cell: Cell, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sweep, self.cell = sweep, cell

    def runtest(self) -> None:
        """Run the cell's seeds; raise `CellFailed` when the cell falls short."""
        from harness.sweeps.report import write_reports
        from harness.sweeps.run_sweep import SweepOptions, SweepRun, run_sweep
        from harness.sweeps.summary import summarize

        parent = self.parent
        assert isinstance(parent, SweepFile)
        options = SweepOptions(out_dir=parent.out_dir, progress=False)
        run = run_sweep(self.sweep, options, only=[self.cell])
        parent.records += run.records
        so_far = SweepRun(self.sweep, list(parent.records), run.started, run.seconds)
        cells = summarize(so_far)
        write_reports(so_far, parent.out_dir, cells)
        (summary,) = [s for s in cells if s.cell == self.cell]
        self.user_properties += [("success_rate", summary.success), ("runs", summary.runs)]
        if run.interrupted:
            raise CellFailed(summary, "stopped before its seeds were run")
        if self.sweep.min_success is not None and not summary.meets(self.sweep.min_success):
            raise CellFailed(summary, f"success rate below min_success {self.sweep.min_success:g}")
        if self.sweep.min_success is None and summary.errored:
            raise CellFailed(summary, f"{summary.errored} run(s) could not be judged")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        """The cell's success rate, interval and the checks that did not pass."""
        if not isinstance(excinfo.value, CellFailed):
            return str(super().repr_failure(excinfo))
        s = excinfo.value.summary
        failing = ", ".join(f"{n} in {k} run(s)" for n, k in s.failed_checks.items()) or "none"
        return (
            f"cell {s.cell.slug} ({s.cell.label}): {excinfo.value}\n"
            f"  {s.passed}/{s.runs} runs passed, 95% interval "
            f"{s.interval[0] * 100:.0f}% to {s.interval[1] * 100:.0f}%\n"
            f"  checks not passed: {failing}"
        )

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Where the cell comes from, for pytest's report."""
        return self.path, None, f"sweep {self.sweep.name} {self.cell.slug} ({self.cell.label})"
