"""Run a soak: one long run of the reference trainer under random faults, judged by its
invariants, measured, and shrunk to a minimal failing plan when an invariant broke.

1. The length: ``steps`` given, or the steps a fault-free run of the configuration trains
   in ``seconds`` (a short calibration run, cached like every baseline, measures the rate).
2. The faults: `harness.soak.plan.draw_plan` from the seed.
3. The run: a scenario of the suite runner (its fault-free baseline of the same length
   first, cached), judged by the invariants below; `harness.soak.measures` reads ETTR,
   goodput and the incidents from its journal.
4. When an invariant broke: `harness.soak.shrink` cuts the plan down, each trial a real
   run judged by that invariant alone; the smallest plan seen to break it is written as a
   suite file that reproduces it (``OUT/minimal.yaml``).

Invariants (each one check of the soak's result; docs/soak.md):
``completed`` (the job reached its last step), ``kept_params_finite`` (no non-finite
parameter in a kept step), ``no_corrupt_checkpoint_loaded``, ``max_stall_seconds`` (no
hang outlived the watchdog), ``final_loss_within`` (of the fault-free run of the same
length) and ``no_processes_left``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import yaml

from faults.plan import FaultPlan
from faults.spec import FaultSpec
from harness import __version__
from harness.errors import TightropeError
from harness.records.events import StepObserved
from harness.records.journal import read_journal
from harness.records.timeline import LEAD_RANK
from harness.run_layout import RunLayout
from harness.running.baseline import default_cache_dir
from harness.running.executor import Executor, LocalExecutor
from harness.running.progress import SuiteProgress
from harness.running.results import ScenarioResult, SuiteResult
from harness.running.runner import INTERRUPTED, Runner, RunOptions
from harness.soak.measures import Measures, measure
from harness.soak.plan import draw_plan, restarts_needed
from harness.soak.shrink import shrink
from harness.suites.scenario import Expect, Scenario, TrainerSpec

#: Steps of the calibration run that measures a configuration's fault-free step rate (a
#: much shorter run's learning-rate schedule is too steep to train the tiny model calmly).
CALIBRATION_STEPS = 300
#: Steps a shrinking trial trains past its last fault (the damage must have time to show).
TRIAL_MARGIN_CHECKPOINTS = 2
#: The pseudo-invariant of a run that errored (crashed, timed out) instead of finishing.
ERRORED = "error"


class SoakError(TightropeError):
    """A soak cannot run as asked (bad option, a calibration run that failed)."""


@dataclass(slots=True)
class SoakOptions:
    """What to soak, for how long, and how to judge it."""

    out_dir: Path
    #: Wall time to fill (the step count a fault-free run trains in it); or ``steps``.
    seconds: float | None = 600.0
    steps: int | None = None
    #: Faults per step, on average (Poisson arrivals).
    rate: float = 0.01
    seed: int = 0
    kinds: tuple[str, ...] | None = None
    preset: Literal["reference", "fragile"] = "reference"
    model: Literal["tiny", "small"] = "tiny"
    world_size: int = 2
    checkpoint_every: int = 50
    #: Largest relative gap of the final loss to the fault-free run's.
    loss_tolerance: float = 0.1
    #: Longest wait between rank 0's finished steps (restarts included), seconds.
    max_stall: float = 60.0
    shrink: bool = True
    shrink_trials: int = 30
    shrink_seconds: float = 900.0
    cache_dir: Path = field(default_factory=default_cache_dir)
    use_cache: bool = True
    progress: bool = True
    stop: threading.Event = field(default_factory=threading.Event)
    #: Where runs execute (docs/cluster.md); None: this machine.
    executor: Executor | None = None
    #: Where progress lines go (one per stage and shrinking trial).
    say: Callable[[str], None] = print

    def check(self) -> None:
        """Refuse what cannot run, naming the option."""
        if (self.seconds is None) == (self.steps is None):
            raise SoakError("give the soak's length as seconds (--minutes) or steps (--steps)")
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise SoakError(f"--minutes must be positive, got {self.seconds / 60:g}")
        if self.steps is not None and self.steps < 2 * self.checkpoint_every:
            raise SoakError(
                f"--steps {self.steps}: a soak spans at least two checkpoints "
                f"({2 * self.checkpoint_every} steps with --checkpoint-every "
                f"{self.checkpoint_every})"
            )
        if not 0 < self.rate <= 1:
            raise SoakError(f"--rate {self.rate:g}: expected faults per step in (0, 1]")
        if self.seed < 0:
            raise SoakError(f"--seed {self.seed}: expected an integer >= 0")


@dataclass(slots=True)
class SoakOutcome:
    """A soak's results: the scorecard's contents, the plan, what shrinking found."""

    result: SuiteResult
    plan: FaultPlan
    steps: int
    #: The invariant shrunk for (a check name, or "error"); None when all held.
    broken: str | None = None
    minimal: tuple[FaultSpec, ...] | None = None
    minimal_file: Path | None = None
    shrink_trials: int = 0
    shrink_complete: bool = False


def invariants(options: SoakOptions) -> Expect:
    """The checks every soak run is judged by."""
    return Expect(
        completed=True,
        kept_params_finite=True,
        no_corrupt_checkpoint_loaded=True,
        max_stall_seconds=options.max_stall,
        final_loss_within=options.loss_tolerance,
        no_processes_left=True,
    )


def _trainer(options: SoakOptions, steps: int, plan: FaultPlan, seconds: float) -> TrainerSpec:
    """The soak's trainer: restarts enough for every process fault of ``plan``
    (`restarts_needed`), a deadline well past the expected time."""
    return TrainerSpec(
        preset=options.preset,
        model=options.model,
        world_size=options.world_size,
        steps=steps,
        checkpoint_every=options.checkpoint_every,
        max_restarts=restarts_needed(plan),
        timeout=3 * seconds + 300,
    )


def calibrate(options: SoakOptions) -> tuple[int, float]:
    """(steps, seconds per step) for ``options.seconds`` of fault-free training, from a
    calibration run (cached like a baseline)."""
    assert options.seconds is not None
    steps = max(CALIBRATION_STEPS, 2 * options.checkpoint_every + 20)  # two saves in the rate
    spec = _trainer(options, steps, FaultPlan(()), 600.0)
    executor = options.executor or LocalExecutor(options.world_size)
    run_dir = executor.baseline(
        spec, options.cache_dir, use_cache=options.use_cache, on_poll=None, stop=options.stop
    ).run_dir
    journal = read_journal(run_dir, warn=False)
    lead = [e for e in journal if e.is_(StepObserved) and e.rank == LEAD_RANK]
    if len(lead) < 10:
        raise SoakError(f"the calibration run reported {len(lead)} steps; see {run_dir}")
    done = json.loads(RunLayout(run_dir).baseline_done.read_text())
    span = lead[-1].wall - lead[0].wall
    per_step = span / (len(lead) - 1)
    start_up = max(0.0, float(done.get("seconds", span)) - span)
    wanted = int((options.seconds - start_up) / per_step)
    return max(2 * options.checkpoint_every, wanted), per_step


#: The order broken invariants are shrunk in: the cheapest trials first (the final-loss
#: check's trials train the soak's whole length).
SHRINK_ORDER = (
    "completed",
    "kept_params_finite",
    "no_corrupt_checkpoint_loaded",
    "max_stall_seconds",
    "no_processes_left",
    "final_loss_within",
)


def _broken(result: ScenarioResult) -> str | None:
    """The invariant to shrink for: an errored run, else the first failed check in
    `SHRINK_ORDER`."""
    if result.error is not None:
        return None if result.error == INTERRUPTED else ERRORED
    failed = {c.name for c in result.checks if c.status == "failed"}
    return next((name for name in SHRINK_ORDER if name in failed), None)


def run_soak(options: SoakOptions) -> SoakOutcome:
    """Plan, run, judge and measure the soak; shrink its plan when an invariant broke."""
    options.check()
    options.out_dir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    clock = time.monotonic()
    if options.steps is not None:
        steps, per_step = options.steps, math.nan
    else:
        options.say("calibrating: a short fault-free run measures the step rate")
        steps, per_step = calibrate(options)
    plan = draw_plan(
        seed=options.seed,
        steps=steps,
        rate=options.rate,
        kinds=options.kinds,
        world_size=options.world_size,
        checkpoint_every=options.checkpoint_every,
    )
    # What the soak is expected to take, fault-free, for its deadline (a generous guess of
    # a quarter second a step when only steps were given).
    expected = options.seconds if options.seconds is not None else max(600.0, 0.25 * steps)
    trainer = _trainer(options, steps, plan, expected)
    options.say(
        f"soak: {steps} steps, {len(plan)} faults drawn (seed {options.seed}, "
        f"rate {options.rate:g} a step), {options.preset} trainer on {options.world_size} ranks"
    )
    scenario = Scenario(
        name="soak",
        description=f"{len(plan)} faults at random over {steps} steps (seed {options.seed}, "
        f"rate {options.rate:g} a step); the invariants must hold throughout.",
        trainer=trainer,
        faults=list(plan),
        expect=invariants(options),
    )
    run_options = RunOptions(
        out_dir=options.out_dir,
        cache_dir=options.cache_dir,
        use_cache=options.use_cache,
        stop=options.stop,
        executor=options.executor,
    )
    soaked = _run_one(scenario, run_options, options.progress)
    soaked.metrics = _metrics(soaked, options, steps, per_step, len(plan))
    outcome = SoakOutcome(
        result=SuiteResult(
            suite=f"soak-seed-{options.seed}",
            preset=options.preset,
            scenarios=[soaked],
            started=started,
            version=__version__,
            source=f"tightrope soak --seed {options.seed}",
            interrupted=soaked.error == INTERRUPTED,
        ),
        plan=plan,
        steps=steps,
        broken=_broken(soaked),
    )
    if outcome.broken is not None and options.shrink and len(plan) > 0:
        _shrink(outcome, scenario, options)
    outcome.result.seconds = time.monotonic() - clock
    return outcome


def _run_one(scenario: Scenario, options: RunOptions, progress: bool) -> ScenarioResult:
    display = SuiteProgress(1, scenario.name) if progress else None
    if display is None:
        return Runner(options).scenario(scenario)
    with display:
        return Runner(options, display).scenario(scenario)


def _metrics(
    result: ScenarioResult, options: SoakOptions, steps: int, per_step: float, planned: int
) -> dict[str, Any]:
    """The soak's figures: its measures, the fault-free run's, and what was asked."""
    metrics: dict[str, Any] = {
        "kind": "soak",
        "seed": options.seed,
        "rate": options.rate,
        "steps": steps,
        "planned_faults": planned,
        "calibrated_seconds_per_step": None if math.isnan(per_step) else round(per_step, 5),
    }
    try:
        journal = read_journal(options.out_dir / result.run_dir, warn=False)
    except TightropeError:
        return metrics
    soaked = measure(journal, result.run_seconds or 0.0)
    metrics |= soaked.to_dict()
    clean = _baseline_measures(options.out_dir, result.baseline_dir, options.cache_dir)
    if clean is not None:
        metrics["baseline"] = {
            "ettr": round(clean.ettr, 4),
            "goodput": round(clean.goodput, 3),
            "wall_seconds": round(clean.wall_seconds, 3),
        }
        if clean.goodput > 0:
            metrics["goodput_ratio"] = round(soaked.goodput / clean.goodput, 4)
    return metrics


def _baseline_measures(out_dir: Path, rel: str | None, cache_dir: Path) -> Measures | None:
    """The fault-free run's measures (its launch time is in the cache's record)."""
    if rel is None:
        return None
    try:
        journal = read_journal(out_dir / rel, warn=False)
        done = RunLayout(cache_dir / rel).baseline_done
        seconds = float(json.loads(done.read_text())["seconds"])
    except (TightropeError, OSError, ValueError, KeyError):
        return None
    return measure(journal, seconds)


def trial_stop(
    faults: tuple[FaultSpec, ...], options: SoakOptions, steps: int, check: str
) -> int | None:
    """Where a shrinking trial stops: two checkpoints past its last fault, with the soak's
    own learning-rate schedule (``stop_after``: a shorter run's steeper schedule would
    train something else); None, the soak's whole length, for the final-loss check (its
    baseline is the soak's)."""
    if check == "final_loss_within" or not faults:
        return None
    last = max(f.at_step or 1 for f in faults)
    stop = last + TRIAL_MARGIN_CHECKPOINTS * options.checkpoint_every
    return stop if stop < steps else None


def _trial_expect(check: str, options: SoakOptions) -> Expect:
    every = invariants(options).model_dump()
    if check == ERRORED:
        return Expect(completed=True)
    return Expect(**{check: every[check]})


def _shrink(outcome: SoakOutcome, soak: Scenario, options: SoakOptions) -> None:
    """Cut the plan down to a smallest one still breaking ``outcome.broken``."""
    check = outcome.broken
    assert check is not None
    run_options = RunOptions(
        out_dir=options.out_dir / "shrink",
        cache_dir=options.cache_dir,
        use_cache=options.use_cache,
        stop=options.stop,
        executor=options.executor,
    )
    runner = Runner(run_options)
    expect = _trial_expect(check, options)
    seen: list[ScenarioResult] = []
    scenarios: list[Scenario] = []

    def trial(faults: tuple[FaultSpec, ...]) -> Scenario:
        stop = trial_stop(faults, options, outcome.steps, check)
        restarts = min(100, 2 * len(faults) + 2)
        trainer = TrainerSpec.model_validate(
            soak.trainer.model_dump() | {"stop_after": stop, "max_restarts": restarts}
        )
        return Scenario(
            name=f"shrink-{len(seen) + 1}",
            description=f"{len(faults)} of the soak's {len(outcome.plan)} faults "
            f"(seed {options.seed}); breaks {check}.",
            trainer=trainer,
            faults=list(faults),
            expect=expect,
        )

    def fails(faults: tuple[FaultSpec, ...]) -> bool:
        if options.stop.is_set():
            return False
        scenario = trial(faults)
        result = runner.scenario(scenario)
        seen.append(result)
        scenarios.append(scenario)
        broke = _broken(result) == check
        length = scenario.trainer.stop_after or scenario.trainer.steps
        options.say(
            f"  shrink trial {len(seen)}: {len(faults)} faults, {length} steps: "
            f"{'still breaks ' + check if broke else 'holds'} ({result.seconds:.0f} s)"
        )
        return broke

    options.say(f"{check} broke: shrinking the plan of {len(outcome.plan)} faults")
    found = shrink(
        tuple(outcome.plan),
        fails,
        max_trials=options.shrink_trials,
        deadline=time.monotonic() + options.shrink_seconds,
    )
    outcome.minimal, outcome.shrink_trials = found.items, found.trials
    outcome.shrink_complete = found.complete
    failing = [
        (s, r)
        for s, r in zip(scenarios, seen, strict=True)
        if tuple(s.faults) == found.items and _broken(r) == check
    ]
    if failing:
        scenario, result = failing[-1]
        result.run_dir = f"shrink/{result.run_dir}"
        if result.baseline_dir:
            result.baseline_dir = f"shrink/{result.baseline_dir}"
    else:  # nothing smaller broke it: the soak itself is the reproduction
        scenario = soak.model_copy(update={"name": "soak-minimal", "expect": expect})
        result = None
    minimal = scenario.model_copy(
        update={
            "name": "soak-minimal",
            "description": f"The smallest part of soak seed {options.seed}'s plan seen to "
            f"break {check}: {len(found.items)} of {len(outcome.plan)} faults.",
        }
    )
    outcome.minimal_file = write_minimal(minimal, options.out_dir / "minimal.yaml")
    if result is not None:
        result.name, result.description = minimal.name, minimal.description
        result.spec = minimal.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        outcome.result.scenarios.append(result)


def write_minimal(scenario: Scenario, path: Path) -> Path:
    """A suite file of one scenario (`tightrope run PATH` replays it)."""
    data = {
        "suite": "soak-minimal",
        "description": "Reproduces a soak's broken invariant (written by tightrope soak).",
        "scenarios": [scenario.model_dump(mode="json", by_alias=True, exclude_defaults=True)],
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
