"""``tightrope checklist RUN_DIR|SUITE``: which monitoring items a run emitted, or which a
suite's scenarios exercise, so a team sees what its monitoring misses (docs/checklist.md)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from harness.checklist.catalogue import GROUPS, ChecklistError, Item
from harness.checklist.run_check import ItemResult, RunChecklist, check_run
from harness.checklist.suite_check import ItemCoverage, SuiteChecklist, check_scenarios
from harness.commands.json_output import JSON_VERSION, emit_json
from harness.suites.suite_loader import load_suite

_SUITE_SUFFIXES = (".yaml", ".yml")


def add_commands(commands: Any) -> None:
    """Add ``checklist`` to the ``tightrope`` parser."""
    checklist = commands.add_parser(
        "checklist",
        help="monitoring items a run emitted, or a suite exercises (and what it misses)",
        description="For a run directory: each item of the monitoring checklist, emitted or "
        "not, with the evidence found. For a suite file: the items its scenarios exercise "
        "through their fault kinds, and those no scenario exercises. Exit 0, or 2 on bad "
        "input.",
    )
    checklist.add_argument("target", type=Path, metavar="RUN_DIR|SUITE")
    checklist.add_argument(
        "--json", action="store_true", help="one JSON document on stdout (docs/json.md)"
    )
    checklist.set_defaults(handler=_checklist)


def suite_checklist(path: Path) -> SuiteChecklist:
    """The checklist of a suite file (its problems raised as `ScenarioError`)."""
    suite = load_suite(path)
    return check_scenarios(
        suite.name, [(s.name, [f.kind for f in s.faults]) for s in suite.scenarios]
    )


def _checklist(args: argparse.Namespace) -> int:
    target: Path = args.target
    if target.is_dir():
        result = check_run(target)
        if args.json:
            emit_json(run_document(result))
        else:
            _print_run(result)
        return 0
    # Whatever a .yaml path names (a FIFO, a link to a device), the suite loader says why
    # it cannot be read.
    if target.suffix in _SUITE_SUFFIXES and (target.exists() or target.is_symlink()):
        suite = suite_checklist(target)
        if args.json:
            emit_json(suite_document(suite, target))
        else:
            _print_suite(suite)
        return 0
    what = "does not exist" if not target.exists() else "is neither a directory nor a .yaml file"
    raise ChecklistError(f"{target} {what}: expected a run directory or a suite file")


def _head() -> dict[str, Any]:
    return {"format": "tightrope.checklist", "version": JSON_VERSION}


def _item(item: Item) -> dict[str, Any]:
    return {
        "name": item.name,
        "group": item.group,
        "title": item.title,
        "faults": list(item.faults),
        "evidence": [str(e) for e in item.evidence],
    }


def run_document(result: RunChecklist) -> dict[str, Any]:
    """``tightrope checklist RUN_DIR --json``."""
    return {
        **_head(),
        "mode": "run",
        "run_dir": str(result.run_dir),
        "items": [
            {
                **_item(r.item),
                "emitted": r.emitted,
                "found": [f.to_dict() for f in r.found],
            }
            for r in result.results
        ],
        "emitted": len(result.emitted),
        "total": len(result.results),
        "not_emitted": [r.item.name for r in result.missing],
        "notes": list(result.notes),
    }


def suite_document(result: SuiteChecklist, path: Path) -> dict[str, Any]:
    """``tightrope checklist SUITE --json``."""
    return {
        **_head(),
        "mode": "suite",
        "suite": result.suite,
        "file": str(path),
        "fault_kinds": list(result.fault_kinds),
        "items": [
            {
                **_item(r.item),
                "exercised": r.exercised,
                "scenarios": list(r.scenarios),
                "by_kinds": list(r.kinds),
            }
            for r in result.results
        ],
        "exercised": len(result.exercised),
        "total": len(result.results),
        "missed": [r.item.name for r in result.missed],
    }


#: A row of either checklist: a run's item, or a suite's.
_Row = TypeVar("_Row", ItemResult, ItemCoverage)


def _print_grouped(rows: Sequence[_Row], line: Callable[[_Row], tuple[str, str]]) -> None:
    """Each row as ``[mark] name detail`` (``line`` gives the mark and the detail), under its
    group's title, in the catalogue's order of groups."""
    for group, title in GROUPS.items():
        grouped = [r for r in rows if r.item.group == group]
        if grouped:
            print(f"\n{title}")
        for r in grouped:
            mark, detail = line(r)
            print(f"  [{mark}] {r.item.name:<28} {detail}")


def _run_line(r: ItemResult) -> tuple[str, str]:
    if not r.item.showable:
        return "-", "not shown by this project yet (evidence: none)"
    shown = [f for f in r.found if f.count] or list(r.found)
    return "x" if r.emitted else " ", "; ".join(f"{f.evidence}: {f.detail}" for f in shown)


def _suite_line(r: ItemCoverage) -> tuple[str, str]:
    if r.exercised:
        n = len(r.scenarios)
        detail = f"{n} scenario{'s' if n != 1 else ''}, through {', '.join(r.kinds)}"
    elif not r.item.faults:
        detail = "no fault kind exercises it"
    else:
        detail = f"missed: needs one of {', '.join(r.item.faults)}"
    if not r.item.showable:
        detail += " (not shown by this project yet)"
    return "x" if r.exercised else " ", detail


def _print_run(result: RunChecklist) -> None:
    print(f"checklist of run {result.run_dir}")
    _print_grouped(result.results, _run_line)
    for note in result.notes:
        print(f"note: {note}")
    missing = [r.item.name for r in result.missing]
    cannot = sum(not r.item.showable for r in result.results)
    print(
        f"\n{len(result.emitted)}/{len(result.results)} items emitted"
        + (f"; not emitted: {', '.join(missing)}" if missing else "")
    )
    print(f"({cannot} of the items not emitted are ones this project cannot show yet)")


def _print_suite(result: SuiteChecklist) -> None:
    print(f"checklist of suite {result.suite}: fault kinds {', '.join(result.fault_kinds) or '-'}")
    _print_grouped(result.results, _suite_line)
    missed = [r.item.name for r in result.missed]
    print(
        f"\n{len(result.exercised)}/{len(result.results)} items exercised"
        + (f"; what this suite's monitoring misses: {', '.join(missed)}" if missed else "")
    )
