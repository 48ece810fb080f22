"""``tightrope checklist RUN_DIR|SUITE``: which monitoring items a run emitted, or which a
suite's scenarios exercise, so a team sees what its monitoring misses (docs/checklist.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.checklist.catalogue import GROUPS, ChecklistError, Item
from harness.checklist.run_check import RunChecklist, check_run
from harness.checklist.suite_check import SuiteChecklist, check_scenarios
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
    if target.is_file() and target.suffix in _SUITE_SUFFIXES:
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


def _print_run(result: RunChecklist) -> None:
    print(f"checklist of run {result.run_dir}")
    for group, title in GROUPS.items():
        rows = [r for r in result.results if r.item.group == group]
        if not rows:
            continue
        print(f"\n{title}")
        for r in rows:
            if not r.item.showable:
                mark, detail = "-", "not shown by this project yet (evidence: none)"
            else:
                mark = "x" if r.emitted else " "
                shown = [f for f in r.found if f.count] or list(r.found)
                detail = "; ".join(f"{f.evidence}: {f.detail}" for f in shown)
            print(f"  [{mark}] {r.item.name:<28} {detail}")
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
    for group, title in GROUPS.items():
        rows = [r for r in result.results if r.item.group == group]
        if not rows:
            continue
        print(f"\n{title}")
        for r in rows:
            mark = "x" if r.exercised else " "
            if r.exercised:
                n = len(r.scenarios)
                detail = f"{n} scenario{'s' if n != 1 else ''}, through {', '.join(r.kinds)}"
            elif not r.item.faults:
                detail = "no fault kind exercises it"
            else:
                detail = f"missed: needs one of {', '.join(r.item.faults)}"
            if not r.item.showable:
                detail += " (not shown by this project yet)"
            print(f"  [{mark}] {r.item.name:<28} {detail}")
    missed = [r.item.name for r in result.missed]
    print(
        f"\n{len(result.exercised)}/{len(result.results)} items exercised"
        + (f"; what this suite's monitoring misses: {', '.join(missed)}" if missed else "")
    )
