"""pytest plugin for scenario suites (registered by the ``pytest11`` entry point).

``pytest scenarios/`` collects every suite file (a YAML file with a top-level
``scenarios:`` list) as one item per scenario; an item fails when any of its checks
fails or could not be judged, and the failure lists those checks with their figures.
Options, in the ``tightrope`` group: ``--tightrope-scorecard DIR`` (write the
scorecards there), ``--tightrope-trainer CMD``, ``--tightrope-preset NAME`` and
``--tightrope-min-score N`` (the session fails below it). A sweep file (top-level
``sweep:``) is one item per cell: `harness.commands.pytest_sweeps`. The ``tightrope_run`` fixture
runs a scenario written in Python and returns its `ScenarioResult`.

Nothing heavy is imported until a suite is collected, so installing tightrope leaves
other test suites untouched.
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness.commands.pytest_sweeps import SWEEP_MARK, SweepFile

if TYPE_CHECKING:
    from harness.running.results import ScenarioResult, SuiteResult
    from harness.running.runner import Runner, RunOptions
    from harness.suites.scenario import Scenario

_SUITE_MARK = re.compile(rb"^scenarios\s*:", re.MULTILINE)
_PRESETS = ("reference", "fragile")


def _preset(text: str) -> str:
    if text not in _PRESETS:
        raise pytest.UsageError(
            f"--tightrope-preset: unknown preset {text!r}; expected one of {', '.join(_PRESETS)}"
        )
    return text


def _min_score(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise pytest.UsageError(
            f"--tightrope-min-score: expected a number from 0 to 100, got {text!r}"
        ) from None
    if not 0 <= value <= 100:
        raise pytest.UsageError(f"--tightrope-min-score: {value:g} is not within 0 to 100")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``tightrope`` option group."""
    group = parser.getgroup("tightrope", "tightrope scenario suites")
    group.addoption(
        "--tightrope-scorecard",
        metavar="DIR",
        type=Path,
        default=None,
        help="write the scorecards (JSON, Markdown, JUnit, HTML, badge) to DIR",
    )
    group.addoption(
        "--tightrope-trainer",
        metavar="CMD",
        default=None,
        help="run every scenario with this trainer command (zero-code attach)",
    )
    group.addoption(
        "--tightrope-preset",
        metavar="NAME",
        type=_preset,
        default=None,
        help="run every scenario with this trainer preset: reference or fragile",
    )
    group.addoption(
        "--tightrope-min-score",
        metavar="N",
        type=_min_score,
        default=None,
        help="fail the session when the resilience score is below N",
    )


class _Session:
    """The plugin's per-session state: one runner, the results gathered for the scorecard.
    The runner and its folder are made at the first scenario run: a session that runs
    none (``--collect-only``, a suite that does not load) leaves no folder behind."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: list[ScenarioResult] = []
        self.suites: list[str] = []
        self.summary: list[str] = []

    @functools.cached_property
    def options(self) -> RunOptions:
        from harness.commands.suite import run_crashpoints
        from harness.running.runner import RunOptions

        config = self.config
        scorecard = config.getoption("tightrope_scorecard")
        return RunOptions(
            out_dir=scorecard or Path(tempfile.mkdtemp(prefix="tightrope-")),
            preset=config.getoption("tightrope_preset"),
            trainer_command=config.getoption("tightrope_trainer"),
            min_score=config.getoption("tightrope_min_score"),
            crashpoints=run_crashpoints,
        )

    @functools.cached_property
    def runner(self) -> Runner:
        from harness.running.runner import Runner

        return Runner(self.options)

    @property
    def out_dir(self) -> Path:
        return self.options.out_dir

    def run(self, scenario: Scenario) -> ScenarioResult:
        from harness.running.launch import check_command
        from harness.running.runner import with_overrides

        scenario = with_overrides(scenario, self.options)
        check_command(scenario.trainer)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        result = self.runner.scenario(scenario)
        self.results.append(result)
        return result

    def suite_result(self) -> SuiteResult:
        from harness import __version__
        from harness.running.results import SuiteResult

        return SuiteResult(
            suite="+".join(dict.fromkeys(self.suites)) or "pytest",
            preset=self.options.preset or "as written",
            scenarios=self.results,
            seconds=sum(r.seconds for r in self.results),
            min_score=self.options.min_score,
            source="pytest",
            version=__version__,
        )


_KEY = pytest.StashKey[_Session]()


def _session(config: pytest.Config) -> _Session:
    if _KEY not in config.stash:
        config.stash[_KEY] = _Session(config)
    return config.stash[_KEY]


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.File | None:
    """A YAML file with a top-level ``scenarios:`` list is a suite; one with a top-level
    ``sweep:`` key is a sweep (`harness.commands.pytest_sweeps`)."""
    if file_path.suffix not in (".yaml", ".yml"):
        return None
    text = file_path.read_bytes()
    if SWEEP_MARK.search(text):
        return SweepFile.from_parent(parent, path=file_path)
    if _SUITE_MARK.search(text):
        return SuiteFile.from_parent(parent, path=file_path)
    return None


class SuiteFile(pytest.File):
    """One suite file; its scenarios are the items."""

    def collect(self) -> Iterator[ScenarioItem]:
        """Validate the whole file, then yield one item per scenario."""
        from harness.suites.suite_loader import load_suite

        suite = load_suite(self.path)  # a ScenarioError is shown as a collection error
        _session(self.config).suites.append(suite.name)
        for scenario in suite.scenarios:
            yield ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario)


class ScenarioFailed(Exception):
    """A scenario failed or errored; carries its result for the report."""

    def __init__(self, result: ScenarioResult) -> None:
        super().__init__(result.name)
        self.result = result


class ScenarioItem(pytest.Item):
    """One scenario: run it, judge it, fail with the failed checks."""

    def __init__(self, *, scenario: Scenario, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario

    def runtest(self) -> None:
        """Run the scenario; raise `ScenarioFailed` unless every check passed."""
        result = _session(self.config).run(self.scenario)
        self.user_properties.extend((c.name, c.figure) for c in result.checks)
        if result.status != "passed":
            raise ScenarioFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        """The failed checks with their figures, or the error with the trainer's log tail."""
        if isinstance(excinfo.value, ScenarioFailed):
            return describe_failure(excinfo.value.result)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Where the scenario comes from, for pytest's report."""
        return self.path, None, f"scenario {self.name} ({self.scenario.scored_class})"


def describe_failure(result: ScenarioResult) -> str:
    """A failed or errored scenario in a few plain lines, not-judged checks labelled."""
    from harness.scorecard.text import describe_check

    lines = [f"scenario {result.name} {result.status} (score {result.score * 100:.0f}/100)"]
    if result.error:
        lines.append(f"error: {result.error}")
    # A check with no evidence fails too, and says so: "FAILED not judged: mttr, ...".
    lines += [f"  FAILED {describe_check(c, detail=True)}" for c in result.failed_checks]
    passed = [c.name for c in result.checks if c.status == "passed"]
    if passed:
        lines.append(f"  passed: {', '.join(passed)}")
    if result.log_tail:
        lines += ["trainer log (last lines):", result.log_tail]
    return "\n".join(lines)


@pytest.fixture
def tightrope_run(request: pytest.FixtureRequest) -> Callable[..., ScenarioResult]:
    """Run a scenario written in Python (a mapping as in a suite file, or a `Scenario`)."""
    from harness.suites.scenario import Scenario
    from harness.suites.suite_loader import parse_suite

    def run(scenario: dict[str, Any] | Scenario, **defaults: Any) -> ScenarioResult:
        if not isinstance(scenario, Scenario):
            data = {"scenarios": [scenario], "defaults": defaults}
            scenario = parse_suite(data, f"<{request.node.name}>").scenarios[0]
        return _session(request.config).run(scenario)

    return run


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the scorecards and apply the score threshold."""
    state = session.config.stash.get(_KEY, None)
    if state is None or not state.results:
        return
    from harness.scorecard.render import write_scorecards

    result = state.suite_result()
    write_scorecards(result, state.out_dir)
    state.summary.append(
        f"tightrope: resilience score {result.score:.1f}/100; scorecards in {state.out_dir}"
    )
    floor = state.options.min_score
    if floor is not None and result.score < floor:
        state.summary.append(
            f"tightrope: score {result.score:.1f} is below --tightrope-min-score {floor:g}"
        )
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The score and where the scorecards are, last in the report."""
    state = terminalreporter.config.stash.get(_KEY, None)
    for line in state.summary if state is not None else []:
        terminalreporter.write_line(line)
