"""The scorecard's coverage: which fault kinds the suite ran against which trainer
mechanisms, and the monitoring checklist's counts (items exercised, items emitted); drawn
in scorecard.md and scorecard.html by `harness.scorecard.render.coverage_tables`.

A scenario's mechanisms come from the spec saved with its result: the reference trainer's
preset (``reference``: every mechanism on; ``fragile``: all off), less ``trainer.disable``,
plus ``trainer.enable``; ``restarts`` is on when torchrun may restart the workers. A
command trainer's mechanisms are its own and not known here: it counts as "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from faults import kinds
from harness.checklist.catalogue import ChecklistError, catalogue
from harness.checklist.run_check import check_run, is_run_dir
from harness.checklist.suite_check import check_scenarios
from harness.mechanisms import LAUNCHER_MECHANISMS, MECHANISMS, OPT_IN, TRAINER_MECHANISMS
from harness.running.results import SuiteResult
from harness.suites.scenario import Scenario, TrainerSpec

#: Every mechanism a column may show, in the order harness/mechanisms.py lists them.
COLUMNS = (*TRAINER_MECHANISMS, *LAUNCHER_MECHANISMS, *OPT_IN)
NO_FAULT = "(no fault)"
#: What each column's mechanism does (the headers' tooltips).
COLUMNS_DOC = {**MECHANISMS, **OPT_IN}


def mechanisms_on(trainer: TrainerSpec) -> frozenset[str] | None:
    """The mechanisms a scenario's trainer ran with; None for a command trainer."""
    if trainer.command is not None:
        return None
    on = set() if trainer.preset == "fragile" else set(MECHANISMS) - set(trainer.disable)
    on.discard("restarts")
    if trainer.restarts > 0:
        on.add("restarts")
    return frozenset(on | set(trainer.enable))


@dataclass(slots=True)
class CoverageRow:
    """One fault kind: the scenarios that injected it, and with which mechanisms on."""

    kind: str
    scenarios: int = 0
    unknown: int = 0  # of them, with a command trainer (mechanisms unknown)
    on: dict[str, int] = field(default_factory=dict)  # mechanism -> scenarios with it on


@dataclass(slots=True)
class Coverage:
    """The suite's coverage table and checklist counts."""

    rows: list[CoverageRow]
    items: int
    exercised: int
    emitted: int | None  # None: the runs were not read
    runs_read: int = 0
    #: Items exercised by the suite's fault kinds and emitted by some run (None: not read).
    exercised_emitted: int | None = None
    notes: list[str] = field(default_factory=list)


def coverage(result: SuiteResult, journal_root: Path | None = None) -> Coverage:
    """The coverage of ``result``; run directories are read under ``journal_root`` (none
    read, and no emitted count, when it is None)."""
    order = {name: i for i, name in enumerate(kinds())}
    rows: dict[str, CoverageRow] = {}
    listed: list[tuple[str, list[str]]] = []
    unread = 0
    for r in result.scenarios:
        try:
            scenario = Scenario.model_validate(r.spec) if r.spec else None
        except ValidationError:
            scenario = None
        if scenario is None:
            unread += 1
            continue
        names = list(dict.fromkeys(f.kind for f in scenario.faults)) or [NO_FAULT]
        listed.append((r.name, [n for n in names if n != NO_FAULT]))
        on = mechanisms_on(scenario.trainer)
        for name in names:
            row = rows.setdefault(name, CoverageRow(name))
            row.scenarios += 1
            if on is None:
                row.unknown += 1
                continue
            for mechanism in on:
                row.on[mechanism] = row.on.get(mechanism, 0) + 1
    notes = []
    if unread:
        notes.append(
            f"{unread} scenario(s) without a readable saved spec: their faults and "
            "mechanisms are not counted"
        )
    if any(row.unknown for row in rows.values()):
        notes.append("a command trainer's mechanisms are its own: counted as unknown")
    suite = check_scenarios(result.suite, listed)
    emitted: int | None = None
    both: int | None = None
    runs_read = 0
    if journal_root is not None:
        seen: set[str] = set()
        for r in result.scenarios:
            run_dir = Path(journal_root) / r.run_dir
            if not r.run_dir or not is_run_dir(run_dir):
                continue
            try:
                checked = check_run(run_dir)
            except ChecklistError:
                continue
            runs_read += 1
            seen.update(x.item.name for x in checked.emitted)
        emitted = len(seen)
        both = len(seen & {x.item.name for x in suite.exercised})
    ranked = sorted(rows.values(), key=lambda row: order.get(row.kind, len(order)))
    return Coverage(
        rows=ranked,
        items=len(catalogue()),
        exercised=len(suite.exercised),
        emitted=emitted,
        runs_read=runs_read,
        exercised_emitted=both,
        notes=notes,
    )
