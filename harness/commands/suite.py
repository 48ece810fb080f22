"""The suite commands of ``tightrope``: run, list, report, compare and schema.

Exit codes: 0 when every scenario passed and the score met the threshold, 1 when not
(or, for ``compare``, when something regressed), 2 on invalid input, before anything ran.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands.executor_args import add_executor_args, chosen_executor
from harness.errors import TightropeError
from harness.suites.keywords import keyword_match
from harness.suites.scenario import TRAINER_PRESETS, Scenario, Suite
from harness.tables import Column, command_console, print_table

if TYPE_CHECKING:
    from harness.running.results import ScenarioResult


class UsageError(TightropeError):
    """A command-line value that cannot be used (named in the message)."""


def _score(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a score from 0 to 100, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a score from 0 to 100, got {value:g}")
    return value


def _cores(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def add_commands(commands: Any) -> None:
    """Add run, list, report, compare and schema to the ``tightrope`` parser."""
    run = commands.add_parser(
        "run",
        help="run a scenario suite and write its scorecards",
        description="Run a suite's scenarios against a trainer, judge them and write the "
        "scorecards (JSON, Markdown, JUnit XML, HTML, badge). Exit 0 when every scenario "
        "passed and the score met --min-score, 1 when not, 2 on invalid input.",
    )
    run.add_argument("suite", type=Path, metavar="SUITE.yaml")
    run.add_argument("--preset", choices=TRAINER_PRESETS, help="trainer preset for every scenario")
    run.add_argument("--trainer", metavar="CMD", help="run this trainer command instead")
    run.add_argument("--scorecard", type=Path, metavar="DIR", help="where results go")
    run.add_argument("-k", dest="keyword", metavar="EXPR", help="only scenarios matching EXPR")
    run.add_argument("--min-score", type=_score, metavar="N", help="fail below this score")
    run.add_argument("--cores", type=_cores, metavar="N", help="cores to fill (default: all)")
    run.add_argument("--no-cache", action="store_true", help="rerun the fault-free baselines")
    add_executor_args(run)
    run.set_defaults(handler=_run)
    listing = commands.add_parser("list", help="validate a suite and list its scenarios")
    listing.add_argument("suite", type=Path, metavar="SUITE.yaml")
    listing.add_argument("-k", dest="keyword", metavar="EXPR", help="only scenarios matching EXPR")
    listing.add_argument(
        "--json", action="store_true", help="one JSON document on stdout (docs/json.md)"
    )
    listing.set_defaults(handler=_list)
    report = commands.add_parser(
        "report", help="judge a saved run again from its journals and rewrite its scorecards"
    )
    report.add_argument("out_dir", type=Path, metavar="DIR")
    report.set_defaults(handler=_report)
    compare = commands.add_parser(
        "compare", help="what regressed between two scorecards (exit 1 when anything did)"
    )
    compare.add_argument("old", type=Path, metavar="A")
    compare.add_argument("new", type=Path, metavar="B")
    compare.set_defaults(handler=_compare)
    schema = commands.add_parser("schema", help="print the JSON Schema of suite files")
    schema.set_defaults(handler=_schema)


def scenario_words(scenario: Scenario) -> list[str]:
    """What ``-k`` matches against: name, fault class and fault kinds."""
    return [scenario.name, scenario.scored_class, *(f.kind for f in scenario.faults)]


def select(suite: Suite, keyword: str | None) -> list[Scenario]:
    """The suite's scenarios that ``-k`` keeps; an error when it keeps none."""
    if keyword is None:
        return list(suite.scenarios)
    chosen = [s for s in suite.scenarios if keyword_match(keyword, scenario_words(s))]
    if not chosen:
        raise UsageError(f"-k {keyword!r} matches no scenario of {suite.source}")
    return chosen


def default_out_dir(suite: Suite, preset: str | None) -> Path:
    """``runs/scorecard-<suite>[-<preset>]``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", suite.name)
    return Path("runs") / (f"scorecard-{name}" + (f"-{preset}" if preset else ""))


def _run(args: argparse.Namespace) -> int:
    from harness.running.runner import RunOptions, run_suite
    from harness.scorecard.render import write_scorecards
    from harness.scorecard.render.terminal import print_results
    from harness.suites.suite_loader import load_suite

    suite = load_suite(args.suite)
    chosen = select(suite, args.keyword)
    out_dir = args.scorecard or default_out_dir(suite, args.preset)
    options = RunOptions(
        out_dir=out_dir,
        preset=args.preset,
        trainer_command=args.trainer,
        use_cache=not args.no_cache,
        min_score=args.min_score,
        crashpoints=run_crashpoints,
    )
    if args.cores:
        options.cores = args.cores
    # SIGTERM (a CI job cancelled, a scheduler's stop) ends the run as Ctrl-C does: every
    # launch killed within a second, the results so far written as a partial scorecard.
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with chosen_executor(args) as options.executor:
            result = run_suite(suite, options, select=[s.name for s in chosen])
    finally:
        signal.signal(signal.SIGTERM, previous)
    files = write_scorecards(result, out_dir)
    console = command_console()
    print_results(result, console)
    console.print(f"scorecards: {files['html']}  {files['json']}", highlight=False)
    if result.interrupted:
        console.print("tightrope: interrupted; the scorecard is partial", highlight=False)
        return 130
    return 0 if result.passed else 1


def run_crashpoints(
    scenario: Scenario, out_dir: Path, cores: int, stop: threading.Event
) -> ScenarioResult:
    """A ``crashpoints:`` scenario (its engine imported only when one runs)."""
    from harness.crashpoints.scenario import run_scenario

    return run_scenario(scenario, out_dir, cores, stop)


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM's handler while a run goes on: it ends the run as Ctrl-C does."""
    raise KeyboardInterrupt


def _list(args: argparse.Namespace) -> int:
    from harness.commands.json_output import emit_json, suite_document
    from harness.suites.suite_loader import load_suite

    suite = load_suite(args.suite)
    chosen = select(suite, args.keyword)
    if args.json:
        emit_json(suite_document(suite, chosen, args.suite))
        return 0
    rows = []
    for s in chosen:
        t, cp = s.trainer, s.crashpoints
        trainer = t.command or f"{t.preset} {t.model} {t.precision} x{t.world_size}"
        rows.append(
            [
                s.name,
                s.scored_class,
                ", ".join(f"{f.kind}@{f.at_step or f.every or '?'}" for f in s.faults) or "-",
                f"crash points, failing on {', '.join(cp.fail_on)}"
                if cp
                else ", ".join(s.expect.checks()),
                cp.command if cp else f"{trainer}, {t.steps} steps",
                f"{s.weight:g}",
            ]
        )
    columns = [
        Column("scenario"),
        Column("class"),
        Column("faults", wrap=True),
        Column("checks", wrap=True),
        Column("trainer", wrap=True),
        Column("weight", justify="right"),
    ]
    print_table(command_console(), f"{suite.name}: {args.suite}", columns, rows)
    return 0


def _report(args: argparse.Namespace) -> int:
    from harness.scorecard.render import write_scorecards
    from harness.scorecard.render.terminal import print_results
    from harness.scorecard.report import rejudge

    result = rejudge(args.out_dir)
    files = write_scorecards(result, args.out_dir)
    console = command_console()
    print_results(result, console)
    console.print(f"scorecards: {files['html']}  {files['json']}", highlight=False)
    return 0 if result.passed else 1


def _compare(args: argparse.Namespace) -> int:
    from harness.scorecard import load_scorecard
    from harness.scorecard.compare import compare
    from harness.scorecard.render import render_comparison

    comparison = compare(load_scorecard(args.old), load_scorecard(args.new))
    print(render_comparison(comparison))
    return 1 if comparison.regressed else 0


def _schema(args: argparse.Namespace) -> int:
    from harness.suites.scenario_schema import suite_schema

    print(json.dumps(suite_schema(), indent=2))
    return 0
