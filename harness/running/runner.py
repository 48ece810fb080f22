"""Run scenarios: baseline (cached), faulted run under a watchdog, oracles -> results.

Every scenario gets its own run dir, ``OUT/runs/<name>``, holding its fault plan, the
trainer's log and journal and its checkpoints; the baseline it was compared with is
copied to ``OUT/baselines/<key>`` (journal and log). Nothing the trainer does can crash
the harness: a timeout, a crash or a trainer that never started is an errored scenario
with the log's tail, scored 0.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape

from harness import __version__
from harness.errors import JournalError, TightropeError
from harness.oracles import judge
from harness.oracles.verdict import Evidence
from harness.records.events import RunEnd, StepObserved
from harness.records.journal import Journal, read_journal
from harness.run_layout import RunLayout
from harness.running.baseline import BaselineError, baseline_key, default_cache_dir
from harness.running.executor import Executor, LocalExecutor, Ran
from harness.running.launch import Launch, check_command, log_tail
from harness.running.progress import SuiteProgress
from harness.running.results import ScenarioResult, SuiteResult
from harness.running.run_lock import RunDirLock
from harness.running.sampling import take_samples
from harness.suites.scenario import Scenario, Suite, TrainerSpec

#: (scenario, out dir, cores it may fill, stop) -> its result, on this machine.
CrashpointsRunner = Callable[[Scenario, Path, int, threading.Event], ScenarioResult]


@dataclass(slots=True)
class RunOptions:
    """How to run a suite: where results go and what to override."""

    out_dir: Path
    #: Run every scenario with this trainer preset (reference or fragile).
    preset: str | None = None
    #: Run every scenario with this trainer command instead of the reference trainer.
    trainer_command: str | None = None
    #: Cores to fill: a scenario of W ranks takes W of them while it runs.
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    cache_dir: Path = field(default_factory=default_cache_dir)
    use_cache: bool = True
    min_score: float | None = None
    #: Set to stop the run: every launch is killed within 0.2 s, scenarios not begun are
    #: not run, and the results gathered so far make a partial scorecard.
    stop: threading.Event = field(default_factory=threading.Event)
    #: Where runs execute; None: this machine, within ``cores`` (`LocalExecutor`).
    executor: Executor | None = None
    #: How a scenario with a ``crashpoints:`` block runs (`harness.crashpoints.scenario`),
    #: passed in by the commands: that room imports this one, not the other way.
    crashpoints: CrashpointsRunner | None = None


def with_overrides(scenario: Scenario, options: RunOptions) -> Scenario:
    """The scenario with the run's trainer overrides applied (validated again)."""
    update: dict[str, object] = {}
    if options.preset is not None:
        update["preset"] = options.preset
    if options.trainer_command is not None:
        update["command"] = options.trainer_command
    if not update:
        return scenario
    trainer = TrainerSpec.model_validate(scenario.trainer.model_dump() | update)
    return scenario.model_copy(update={"trainer": trainer})


#: The error of a scenario the user stopped, or never began because of it.
INTERRUPTED = "interrupted: the suite run was stopped (Ctrl-C or SIGTERM)"


def _read(run_dir: Path) -> Journal:
    return read_journal(run_dir, warn=False)  # a torn last line of a killed rank is expected


def _crash(launch: Launch, journal: Journal, timeout: float) -> str | None:
    """Why the run counts as errored, or None when its outcome can be judged."""
    if launch.interrupted:
        return INTERRUPTED
    if launch.timed_out:
        return f"timed out: killed by the watchdog after {timeout:g} s"
    if launch.exit_code == 0:
        return None
    ends = journal.of_kind(RunEnd)
    if ends and ends[-1].get("gave_up") is True:  # on purpose: a judged failure, not a crash
        return None
    code, how = launch.exit_code, ""
    if code is not None and -code in set(signal.Signals):  # (a signal: a crash, not an exit)
        how = f", killed by {signal.Signals(-code).name}"
    return f"the trainer crashed (exit code {code}{how}){attempt_errors(journal)}"


def _no_steps(journal: Journal) -> str | None:
    """The error of a run in which the agent found no training step, with its reason."""
    if journal.of_kind(StepObserved):
        return None
    why = next((str(e.get("no_steps")) for e in journal.of_kind(RunEnd) if e.get("no_steps")),
               "no step event in the journal")  # fmt: skip
    return f"the agent found no training step: {why} (see docs/attach.md)"


def attempt_errors(journal: Journal) -> str:
    """The last error of each attempt (torchrun restarts), as ``; attempt N, rank R: ...``."""
    last: dict[int, str] = {}
    for end in journal.of_kind(RunEnd):
        if end.get("status") != "completed" and end.get("reason"):
            last[end.restart] = f"rank {end.rank}: {end.get('reason')}"
    if len(last) == 1 and set(last) == {0}:
        return ": " + last[0].split(": ", 1)[1]
    return "".join(f"; attempt {n}, {why}" for n, why in sorted(last.items()))


def keep_baseline(cached: Path, out_dir: Path) -> Path:
    """Copy a cached baseline's journal and log to ``out_dir/baselines/<key>``; returns it.

    Scenarios sharing a baseline ask for it from parallel threads (suites may share an
    out dir from parallel processes): a lock file per key lets one copy, and the copy is
    made aside and renamed into place, so the folder is whole or absent, even after a kill.
    """
    kept = out_dir / "baselines" / cached.name
    if RunLayout(kept).log.is_file():  # renamed into place whole
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    # flock, not a threading.Lock: each open() is its own lock holder, thread or process.
    with open(kept.parent / f".{cached.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if RunLayout(kept).log.is_file():  # another caller copied it while we waited
            return kept
        shutil.rmtree(kept, ignore_errors=True)  # a half copy made before copies were atomic
        partial = kept.with_name(f".{cached.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        source, copy = RunLayout(cached), RunLayout(partial)
        shutil.copytree(source.journal, copy.journal)
        shutil.copy2(source.log, copy.log)
        partial.rename(kept)
    return kept


def _unjudged(scenario: Scenario) -> ScenarioResult:
    """A scenario's result before its run: what it is, no checks yet."""
    return ScenarioResult(
        name=scenario.name,
        fault_class=scenario.scored_class,
        weight=scenario.weight,
        checks=[],
        seed=scenario.trainer.seed,
        run_dir=f"runs/{scenario.name}",
        description=scenario.description,
        spec=scenario.model_dump(mode="json", by_alias=True, exclude_defaults=True),
    )


def _note_launch(result: ScenarioResult, ran: Ran, run_dir: Path) -> Launch:
    """What the faulted run's launch left: its log's tail, exit, time and leftovers, and
    the attempts a cluster lost before it."""
    launch = ran.launch
    result.lost_attempts += ran.lost
    result.ran_on = ran.node
    result.log_tail = log_tail(RunLayout(run_dir).log)
    result.exit_code = launch.exit_code
    result.run_seconds = launch.seconds
    result.left_behind, result.ended = launch.left_behind, launch.ended
    result.left_processes = list(launch.left_processes)
    return launch


class Runner:
    """Runs the scenarios of a suite with a shared progress display and core budget."""

    def __init__(self, options: RunOptions, progress: SuiteProgress | None = None) -> None:
        self.options = options
        self.progress = progress
        self.executor = options.executor or LocalExecutor(options.cores)

    def _bar(
        self, label: str, steps: int, *, counts: bool = True
    ) -> tuple[Callable[[Path], None], Callable[[str], None]]:
        if self.progress is None:
            return (lambda _d: None), (lambda _l: None)
        progress, task = self.progress, self.progress.start(label, steps)
        return (lambda d: progress.poll(task, d)), (
            lambda line: progress.finish(task, line, counts=counts)
        )

    def scenario(self, scenario: Scenario) -> ScenarioResult:
        """Run one scenario (its baseline first when a check needs one) and judge it."""
        if scenario.crashpoints is not None:
            return self._crashpoints(scenario, scenario.crashpoints.cores)
        spec, out = scenario.trainer, self.options.out_dir
        cores = self.executor.take(spec.world_size)
        started = time.monotonic()
        result = _unjudged(scenario)
        poll, finish = self._bar(scenario.name, spec.steps)
        stack = contextlib.ExitStack()
        try:
            baseline = self._baseline(scenario, result)
            run_dir = out / result.run_dir
            # The run dir is this runner's while its trainer runs: another suite run on the
            # same out dir is refused, not wiped out; the trainer shares the claim.
            claim = stack.enter_context(RunDirLock.acquire(run_dir))
            claim.clear()
            plan = RunLayout(run_dir).plan
            plan.write_text(yaml.safe_dump(scenario.plan(), sort_keys=False))
            if self.options.stop.is_set():
                result.error = INTERRUPTED
                return result
            stop = self.options.stop
            # The plan is kept with the run either way; a fault-free scenario passes none
            # (the reference trainer refuses an empty --fault-plan).
            given = plan if scenario.faults else None
            ran = self.executor.faulted(
                scenario, run_dir, given, lambda: poll(run_dir), stop, claim.env()
            )
            launch = _note_launch(result, ran, run_dir)
            try:
                journal = _read(run_dir)
            except JournalError as exc:
                result.error = _crash(launch, Journal([]), spec.timeout) or "exited 0"
                never = (
                    "the agent never attached: the command never imported torch, ran no "
                    "forward with grad and saved or loaded no file"
                    if spec.command is not None
                    else "the trainer never started"
                )
                result.error += f"; no journal: {never} ({exc})"
                return result
            result.error = _crash(launch, journal, spec.timeout) or _no_steps(journal)
            if result.error is None:
                kept = result.baseline_dir  # the cached baseline keeps its checkpoints
                cached = self.options.cache_dir / kept if kept and baseline else None
                take_samples(scenario, run_dir, cached, stop)
            evidence = Evidence(
                journal=journal,
                run_dir=run_dir,
                target_steps=target_steps(spec, baseline),
                exit_code=launch.exit_code,
                baseline=baseline,
                left_behind=launch.left_behind,
                left_processes=tuple(launch.left_processes),
                ended=launch.ended,
            )
            result.checks = judge(scenario.expect, evidence)
            if result.status == "passed":
                result.log_tail = ""
        except TightropeError as exc:
            result.error = str(exc)
        except Exception as exc:  # one scenario's surprise must not end the suite
            result.error = f"harness error: {type(exc).__name__}: {exc}"
        finally:
            stack.close()
            self.executor.give(cores)
            result.seconds = time.monotonic() - started
            finish(_line(result))
        return result

    def _crashpoints(self, scenario: Scenario, cores: int) -> ScenarioResult:
        """A crash-point exploration, within ``cores`` of the run's cores."""
        _, finish = self._bar(scenario.name, 1)
        run = self.options.crashpoints
        if run is None:
            result = _unjudged(scenario)
            result.error = "crashpoints scenarios run with `tightrope run` or pytest only"
        elif self.options.stop.is_set():
            result = _unjudged(scenario)
            result.error = INTERRUPTED
        else:
            taken = self.executor.take(cores)
            try:
                result = run(scenario, self.options.out_dir, taken, self.options.stop)
            finally:
                self.executor.give(taken)
        finish(_line(result))
        return result

    def _baseline(self, scenario: Scenario, result: ScenarioResult) -> Journal | None:
        if not scenario.expect.needs_baseline(command=scenario.trainer.command is not None):
            return None
        spec = scenario.trainer
        poll, finish = self._bar(f"{scenario.name} (baseline)", spec.steps, counts=False)
        try:
            ran = self.executor.baseline(
                spec,
                self.options.cache_dir,
                use_cache=self.options.use_cache,
                on_poll=poll,
                stop=self.options.stop,
            )
        except BaselineError as exc:
            finish(f"  baseline of {scenario.name} failed")
            raise BaselineError(f"{exc}\n{log_tail(self._log_of(spec))}") from None
        finish(f"  baseline of {scenario.name}: ready")
        cached = ran.run_dir
        result.lost_attempts += tuple(f"baseline: {line}" for line in ran.lost)
        kept = keep_baseline(cached, self.options.out_dir)
        result.baseline_dir = f"baselines/{cached.name}"
        return _read(kept)

    def _log_of(self, spec: TrainerSpec) -> Path:
        return RunLayout(self.options.cache_dir / "baselines" / baseline_key(spec)).log


def target_steps(spec: TrainerSpec, baseline: Journal | None) -> int:
    """The step a complete run reaches: ``stop_after`` or ``steps`` for the reference
    trainer; for a command trainer, the last step its fault-free run reached (it counts its
    own steps)."""
    if spec.command is None or baseline is None:
        return spec.stop_after or spec.steps
    return max(
        (e.step for e in baseline if e.is_(StepObserved) and e.rank == 0), default=spec.steps
    )


def _line(result: ScenarioResult) -> str:
    mark = {"passed": "[green]PASS", "failed": "[red]FAIL", "error": "[magenta]ERROR"}
    failed = ", ".join(c.name for c in result.failed_checks)
    why = result.error.splitlines()[0] if result.error else failed
    return (
        f"{mark[result.status]}[/] {escape(result.name)}  score {result.score * 100:.0f}  "
        f"{result.seconds:.1f}s" + (f"  ({escape(why)})" if why else "")
    )


def run_suite(
    suite: Suite,
    options: RunOptions,
    *,
    select: Sequence[str] | None = None,
    progress: bool = True,
) -> SuiteResult:
    """Run the suite's scenarios (all, or those named in ``select``) and gather results."""
    scenarios = [with_overrides(s, options) for s in suite.scenarios]
    if select is not None:
        scenarios = [s for s in scenarios if s.name in set(select)]
    for s in scenarios:
        check_command(s.trainer)
    if any(s.trainer.launcher == "docker" for s in scenarios):
        from harness.docker.image import connect

        connect().close()  # an engine that cannot be reached is refused before any run
    options.out_dir.mkdir(parents=True, exist_ok=True)
    started, clock = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.monotonic()
    title = f"{suite.name} ({options.preset or 'as written'})"
    display = SuiteProgress(len(scenarios), title) if progress else None
    runner = Runner(options, display)
    workers = max(1, min(len(scenarios), runner.executor.slots(options.cores)))
    if display is not None:
        display.__enter__()
    pool = ThreadPoolExecutor(max_workers=workers)
    futures = [pool.submit(runner.scenario, s) for s in scenarios]
    try:
        interrupted = wait_or_stop(futures, options.stop)
    finally:
        pool.shutdown(wait=True)
        if display is not None:
            display.__exit__(None, None, None)
    results = [f.result() for f in futures]
    return SuiteResult(
        suite=suite.name,
        preset=options.preset or _presets(scenarios),
        scenarios=results,
        started=started,
        seconds=time.monotonic() - clock,
        min_score=options.min_score,
        source=suite.source,
        version=__version__,
        interrupted=interrupted,
    )


def wait_or_stop(futures: Sequence[Future[Any]], stop: threading.Event) -> bool:
    """Wait for ``futures`` in short waits, so that Ctrl-C (and SIGTERM, raised as it) get
    through; on one, set ``stop`` (running launches are killed, queued work ends at once)
    and wait for them to end. True when interrupted."""
    try:
        while not all(f.done() for f in futures):
            wait(futures, timeout=0.5)
    except KeyboardInterrupt:
        stop.set()
        wait(futures)
        return True
    return False


def _presets(scenarios: Sequence[Scenario]) -> str:
    names = {
        "command" if s.trainer.command or s.crashpoints else s.trainer.preset for s in scenarios
    }
    return names.pop() if len(names) == 1 else "mixed"
