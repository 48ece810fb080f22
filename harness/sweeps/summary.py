"""What a sweep's records say per cell (success rate with its interval, final loss, time,
steps lost, the checks that failed) and between cells (which differ, and how surely)."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any

from harness.sweeps.run_sweep import SweepRun
from harness.sweeps.stats import ALPHA, Spread, finite, fisher, holm, mann_whitney, spread, wilson
from harness.sweeps.sweep_file import Cell


@dataclass(frozen=True, slots=True)
class CellSummary:
    """One cell over its seeds."""

    cell: Cell
    runs: int
    passed: int
    #: Runs that could not be judged (crash before training, timeout): not successes.
    errored: int
    interval: tuple[float, float]
    final_loss: Spread | None
    #: Finished runs whose final loss is not a finite number (diverged).
    nonfinite_losses: int
    run_seconds: Spread | None
    steps_lost: Spread | None
    #: Check name -> runs in which it did not pass (failed or not judged).
    failed_checks: dict[str, int]

    @property
    def success(self) -> float | None:
        """Share of runs with every check passed; None for a cell with no run."""
        return self.passed / self.runs if self.runs else None

    def meets(self, min_success: float | None) -> bool:
        """Whether the cell's success rate reaches ``min_success`` (always, without one)."""
        if min_success is None:
            return True
        return self.success is not None and self.success >= min_success

    def to_dict(self) -> dict[str, Any]:
        """Plain data for sweep.json."""
        return {
            "cell": self.cell.index,
            "label": self.cell.label,
            "settings": dict(self.cell.settings),
            "runs": self.runs,
            "passed": self.passed,
            "errored": self.errored,
            "success_rate": self.success,
            "interval": list(self.interval),
            "final_loss": self.final_loss.to_dict() if self.final_loss else None,
            "nonfinite_losses": self.nonfinite_losses,
            "run_seconds": self.run_seconds.to_dict() if self.run_seconds else None,
            "steps_lost": self.steps_lost.to_dict() if self.steps_lost else None,
            "failed_checks": self.failed_checks,
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two cells side by side: p-values raw and Holm-corrected over all pairs."""

    a: int
    b: int
    success_p: float
    success_p_holm: float
    loss_p: float | None
    loss_p_holm: float | None
    note: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data for sweep.json."""
        return {
            "cells": [self.a, self.b],
            "success_p": self.success_p,
            "success_p_holm": self.success_p_holm,
            "final_loss_p": self.loss_p,
            "final_loss_p_holm": self.loss_p_holm,
            "note": self.note,
        }


def summarize(run: SweepRun) -> list[CellSummary]:
    """Each cell's summary, in grid order."""
    out = []
    for cell in run.sweep.cells():
        records = run.of_cell(cell)
        passed = sum(r.passed for r in records)
        failed: Counter[str] = Counter()
        for r in records:
            failed.update(c.name for c in r.result.checks if c.status != "passed")
        done = [r for r in records if r.result.error is None]
        losses = [r.final_loss for r in done]
        out.append(
            CellSummary(
                cell=cell,
                runs=len(records),
                passed=passed,
                errored=len(records) - len(done),
                interval=wilson(passed, len(records)),
                final_loss=spread(finite(losses)),
                nonfinite_losses=len(losses) - len(finite(losses)),
                run_seconds=spread(
                    [r.result.run_seconds for r in records if r.result.run_seconds is not None]
                ),
                steps_lost=spread([float(r.steps_lost) for r in done if r.steps_lost is not None]),
                failed_checks=dict(sorted(failed.items())),
            )
        )
    return out


def compare(run: SweepRun, cells: list[CellSummary]) -> list[Comparison]:
    """Every pair of cells: Fisher's exact test on their successes, Mann-Whitney U on
    their finite final losses; each family Holm-corrected; a plain-words note."""
    pairs = [(a, b) for a, b in itertools.combinations(cells, 2) if a.runs and b.runs]
    losses = {
        c.cell.index: finite([r.final_loss for r in run.of_cell(c.cell) if r.result.error is None])
        for c in cells
    }
    success = [fisher(a.passed, a.runs, b.passed, b.runs) for a, b in pairs]
    loss: list[float | None] = [mann_whitney(losses[a.cell.index], losses[b.cell.index])
                                for a, b in pairs]  # fmt: skip
    success_adj, loss_adj = holm(success), holm(loss)
    out = []
    for i, (a, b) in enumerate(pairs):
        sp, lp = success_adj[i], loss_adj[i]
        assert sp is not None
        out.append(
            Comparison(a.cell.index, b.cell.index, success[i], sp, loss[i], lp, _note(a, b, sp, lp))
        )
    return out


def _note(a: CellSummary, b: CellSummary, success_p: float, loss_p: float | None) -> str:
    """The comparison in words, naming only what the data shows at `ALPHA`."""
    said = []
    if success_p < ALPHA:
        hi, lo = (a, b) if (a.success or 0) > (b.success or 0) else (b, a)
        said.append(
            f"{hi.cell.label} succeeds more often ({_pct(hi.success)} vs {_pct(lo.success)}, "
            f"p = {success_p:.2g})"
        )
    if loss_p is not None and loss_p < ALPHA and a.final_loss and b.final_loss:
        lo_l, hi_l = (a, b) if a.final_loss.median < b.final_loss.median else (b, a)
        assert lo_l.final_loss and hi_l.final_loss
        said.append(
            f"{lo_l.cell.label} ends at a lower loss ({lo_l.final_loss.median:.3f} vs "
            f"{hi_l.final_loss.median:.3f}, p = {loss_p:.2g})"
        )
    if said:
        return "; ".join(said)
    shown = f"success p = {success_p:.2g}" + (f", loss p = {loss_p:.2g}" if loss_p else "")
    return f"no difference shown at {ALPHA:g} ({shown}, Holm-corrected)"


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate * 100:.0f}%"
