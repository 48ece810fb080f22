"""Judge a saved suite run again from its journals, and write its scorecards.

`tightrope report DIR` reads ``DIR/scorecard.json``, rebuilds each scenario from the spec
saved there, runs the oracles again on the journals and checkpoints under ``DIR`` and
renders every scorecard file anew. What only the launch knew (a timeout, a crash, the
exit code) is kept from the saved result.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from harness.errors import JournalError
from harness.oracles import judge
from harness.oracles.verdict import Evidence
from harness.records.journal import read_journal
from harness.running.results import ScorecardError, SuiteResult
from harness.scorecard import load_scorecard
from harness.suites.scenario import Scenario


def rejudge(out_dir: Path) -> SuiteResult:
    """The suite result of ``out_dir`` with every scenario judged again from disk."""
    saved = load_scorecard(out_dir)
    for result in saved.scenarios:
        try:
            scenario = Scenario.model_validate(result.spec)
        except ValidationError as exc:
            raise ScorecardError(
                f"{out_dir}: the saved spec of scenario {result.name!r} is invalid: {exc}"
            ) from None
        if scenario.crashpoints is not None:
            continue  # its checks are its points' verdicts, judged when they ran: kept
        try:
            journal = read_journal(out_dir / result.run_dir, warn=False)
            baseline = (
                read_journal(out_dir / result.baseline_dir, warn=False)
                if result.baseline_dir
                else None
            )
        except JournalError:
            continue  # nothing to judge again: keep the saved verdicts
        evidence = Evidence(
            journal=journal,
            run_dir=out_dir / result.run_dir,
            target_steps=scenario.trainer.steps,
            exit_code=result.exit_code,
            baseline=baseline,
            left_behind=result.left_behind,
            left_processes=tuple(result.left_processes),
            ended=result.ended,
        )
        result.checks = judge(scenario.expect, evidence)
    return saved
