"""Every fault kind is complete: a class and a place to act, a strategy that draws it, a
row in the scenario reference and a scenario in some suite. Adding a kind means a module in
faults/, a line in faults/builtin.py, a faults.bias.Bias on each field a strategy should
draw (harness/suites/strategies.py derives it), a row in docs/scenarios.md and a scenario;
this file says which is missing."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import yaml

from faults import FAULT_CLASSES, kinds
from faults.builtin import BUILTIN_KINDS
from harness.commands.main import main
from harness.suites.strategies import DRAWN_KINDS
from harness.suites.suite_loader import load_suite

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| `(\w+)` \| (\w+) \| (\w+) \| .+ \|$", re.MULTILINE)


def suite_files() -> list[Path]:
    """The shipped suites and the test suites (YAML files with ``scenarios``)."""
    found = sorted((ROOT / "scenarios").glob("*.yaml"))
    for path in sorted((ROOT / "tests").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "scenarios" in data:
            found.append(path)
    return found


def test_the_table_is_the_registry_and_every_kind_declares_its_class() -> None:
    table = kinds()
    assert list(table) == [spec.model_fields["kind"].default for spec, _ in BUILTIN_KINDS]
    for name, kind in table.items():
        assert kind.spec.fault_class in FAULT_CLASSES, name
        assert kind.spec.reach in ("step", "documents", "node"), name
        assert kind.spec.description, name
    assert {k.spec.fault_class for k in table.values()} == set(FAULT_CLASSES)


def test_every_kind_that_acts_in_the_trainer_has_a_strategy() -> None:
    in_trainer = {name for name, kind in kinds().items() if kind.spec.reach != "node"}
    assert set(DRAWN_KINDS) == in_trainer


def test_every_kind_has_a_row_in_the_scenario_reference() -> None:
    rows = ROW.findall((ROOT / "docs" / "scenarios.md").read_text())
    documented = {kind: (fault_class, reach) for kind, fault_class, reach in rows}
    expected = {n: (k.spec.fault_class, k.spec.reach) for n, k in kinds().items()}
    assert documented == expected
    assert len(rows) == len(documented)  # no kind twice


def test_every_kind_appears_in_a_scenario_of_some_suite() -> None:
    used = {
        fault.kind
        for path in suite_files()
        for scenario in load_suite(path).scenarios
        for fault in scenario.faults
    }
    assert set(kinds()) - used == set()


def test_tightrope_faults_lists_every_kind_under_its_class() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["faults"]) == 0
    heading = None
    listed: dict[str, str] = {}
    for line in out.getvalue().splitlines():
        if line in FAULT_CLASSES:
            heading = line
        elif heading and (match := re.match(r"^  (\w+) ", line)):
            listed[match.group(1)] = heading
    assert listed == {name: kind.spec.fault_class for name, kind in kinds().items()}
