"""Documents nested past the limit, files that are no files, counts past any job: each
refused in one line naming the limit, or (a journal line) skipped with a warning."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from faults import FaultPlan, FaultSpecError, parse_fault
from faults.input_limits import MAX_DEPTH, InputLimitError, check_json_depth, read_bytes
from harness.records.journal import TornLineWarning, read_journal
from harness.running.results import ScorecardError
from harness.scorecard import load_scorecard
from harness.suites.suite_loader import ScenarioError, load_suite
from harness.sweeps.sweep_file import SweepError, load_sweep

DEEP = "[" * 500 + "]" * 500


def test_deep_yaml_is_refused_with_its_line(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text("suite: x\nscenarios:\n  - " + DEEP + "\n")
    with pytest.raises(ScenarioError, match=rf"suite.yaml:3: nested more than {MAX_DEPTH}"):
        load_suite(suite)
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults: " + "{a: " * 300 + "1" + "}" * 300)
    with pytest.raises(FaultSpecError, match="nested more than 64 levels deep"):
        FaultPlan.from_yaml(plan)


def test_yaml_just_within_the_limit_is_read(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))
    with pytest.raises(FaultSpecError, match=r"faults\[0\]"):  # read, then invalid
        FaultPlan.from_yaml(plan)


def test_json_depth_ignores_brackets_in_strings() -> None:
    check_json_depth(json.dumps({"text": "[" * 1000}), "x")
    with pytest.raises(InputLimitError, match="nested 65 levels deep; at most 64"):
        check_json_depth("[" * 65 + "]" * 65, "x")


def test_a_deep_scorecard_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "scorecard.json").write_text(DEEP)
    with pytest.raises(ScorecardError, match="nested 500 levels deep"):
        load_scorecard(tmp_path)


def test_a_deep_journal_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    common = {"v": 1, "wall": time.time(), "mono": 0.0, "rank": 0, "restart": 0, "step": 0}
    good = json.dumps({**common, "kind": "run_start"})
    deep = json.dumps({**common, "kind": "step", "step": 1})[:-1] + ', "x": ' + "[" * 10**5
    deep += "]" * 10**5 + "}"
    (journal / "rank-0.jsonl").write_text(f"{good}\n{deep}\n{good}\n")
    with pytest.warns(TornLineWarning, match="rank-0.jsonl:2: nested 100001 levels deep"):
        events = read_journal(tmp_path)
    assert [e.kind for e in events] == ["run_start", "run_start"]


@pytest.mark.parametrize("hostile", ["fifo", "dev_zero", "folder"])
def test_only_regular_files_are_read(tmp_path: Path, hostile: str) -> None:
    path = tmp_path / "suite.yaml"
    if hostile == "fifo":
        os.mkfifo(path)
    elif hostile == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    with pytest.raises(InputLimitError, match="is not a regular file"):
        read_bytes(path, "suite", 1 << 20)
    with pytest.raises(ScenarioError, match="suite is not a regular file"):
        load_suite(path)


def test_a_link_is_refused_where_links_are_not_followed(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_bytes(tmp_path / "link", "x", 10) == b"{}"
    with pytest.raises(InputLimitError, match="is a symbolic link; not followed"):
        read_bytes(tmp_path / "link", "x", 10, follow_symlinks=False)


def test_a_sweep_of_a_trillion_seeds_is_refused_before_making_them(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("scenario: {trainer: {steps: 3}}\nseeds: 1000000000000\n")
    started = time.monotonic()
    with pytest.raises(SweepError, match="1000000000000 seeds is past 10000 runs"):
        load_sweep(sweep)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"at_step": 10**12}, "less than or equal to 100000000"),
        ({"at_step": 1, "duration": 10**12}, "less than or equal to 100000000"),
        ({"at_step": 1, "ranks": [10**12]}, "ranks must be from 0 to 1048575"),
        ({"at_step": 1, "target": ""}, "at least 1 character"),
    ],
)
def test_fault_numbers_are_bounded(fault: dict[str, object], message: str) -> None:
    with pytest.raises(FaultSpecError, match=message):
        parse_fault({"kind": "nan_grad", **fault})
