"""Where a scenario's runs execute: an executor starts the faulted run and the fault-free
baseline, and the runner judges what they left on disk (judging never moves).

`LocalExecutor` is the runner's own way: processes on this machine, within ``--cores``.
`harness.running.ray_executor.RayExecutor` runs the same launch as one task on a Ray
cluster's node and brings back the files judging reads (docs/cluster.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.run_layout import RunLayout
from harness.running.baseline import baseline_run
from harness.running.launch import (
    Launch,
    custom_command,
    reference_command,
    run_process,
    trainer_cwd,
    trainer_env,
)
from harness.suites.scenario import Scenario, TrainerSpec

#: How a scenario's error starts when a cluster lost every attempt of a run: the
#: cluster's failure, never cached as the configuration's outcome.
CLUSTER_ERROR = "cluster error:"


@dataclass(frozen=True, slots=True)
class Ran:
    """A launch as its executor saw it: how it ended, and the attempts lost before it to a
    cluster node's failure (one line each; never the trainer's doing)."""

    launch: Launch
    lost: tuple[str, ...] = ()
    #: The cluster node it ran on; None: this machine.
    node: str | None = None


@dataclass(frozen=True, slots=True)
class BaselineRan:
    """A fault-free baseline in the cache, and the attempts lost before it (as `Ran`)."""

    run_dir: Path
    lost: tuple[str, ...] = ()


class Executor(Protocol):
    """Runs a scenario's launches somewhere; the runner judges the files they leave."""

    #: Its name in messages and on the command line (``--executor``).
    name: str

    def slots(self, asked: int) -> int:
        """How many scenarios to run at once, given ``--cores``."""
        ...

    def take(self, ranks: int) -> int:
        """Wait for room for ``ranks`` ranks; what to `give` back afterwards."""
        ...

    def give(self, taken: int) -> None:
        """Give back what `take` returned."""
        ...

    def faulted(
        self,
        scenario: Scenario,
        run_dir: Path,
        plan: Path | None,
        poll: Callable[[], None],
        stop: threading.Event,
        owner: Mapping[str, str],
    ) -> Ran:
        """Run the scenario's faulted run; its files end up in ``run_dir``."""
        ...

    def baseline(
        self,
        spec: TrainerSpec,
        cache_dir: Path,
        *,
        use_cache: bool,
        on_poll: Callable[[Path], None] | None,
        stop: threading.Event,
    ) -> BaselineRan:
        """The cached fault-free run of ``spec``, run when missing."""
        ...


class Cores:
    """Counts free cores so parallel scenarios never ask for more ranks than exist."""

    def __init__(self, total: int) -> None:
        self.total, self.free = max(1, total), max(1, total)
        self._cond = threading.Condition()

    def take(self, n: int) -> int:
        n = min(n, self.total)
        with self._cond:
            self._cond.wait_for(lambda: self.free >= n)
            self.free -= n
        return n

    def give(self, n: int) -> None:
        with self._cond:
            self.free += n
            self._cond.notify_all()


class LocalExecutor:
    """Processes on this machine, a scenario of W ranks taking W of ``cores``."""

    name = "local"

    def __init__(self, cores: int) -> None:
        self._cores = Cores(cores)

    def slots(self, asked: int) -> int:
        return asked

    def take(self, ranks: int) -> int:
        return self._cores.take(ranks)

    def give(self, taken: int) -> None:
        self._cores.give(taken)

    def faulted(
        self,
        scenario: Scenario,
        run_dir: Path,
        plan: Path | None,
        poll: Callable[[], None],
        stop: threading.Event,
        owner: Mapping[str, str],
    ) -> Ran:
        return Ran(launch_faulted(scenario, run_dir, plan, poll, stop, owner=owner))

    def baseline(
        self,
        spec: TrainerSpec,
        cache_dir: Path,
        *,
        use_cache: bool,
        on_poll: Callable[[Path], None] | None,
        stop: threading.Event,
    ) -> BaselineRan:
        run_dir = baseline_run(spec, cache_dir, use_cache=use_cache, on_poll=on_poll, stop=stop)
        return BaselineRan(run_dir)


def launch_faulted(
    scenario: Scenario,
    run_dir: Path,
    plan: Path | None,
    poll: Callable[[], None],
    stop: threading.Event | None = None,
    *,
    owner: Mapping[str, str] | None = None,
) -> Launch:
    """The faulted run: one launch, or a stop and a resume when the scenario asks.
    ``owner``: the environment by which the trainer shares the runner's claim."""
    spec = scenario.trainer
    deadline = time.monotonic() + spec.timeout
    log, env = RunLayout(run_dir).log, {**trainer_env(spec), **(owner or {})}
    if spec.command is not None:
        argv = custom_command(spec, run_dir, plan)
        cwd = trainer_cwd(spec, run_dir)
        return run_process(
            argv, log=log, deadline=deadline, env=env, on_poll=poll, cwd=cwd, stop=stop
        )
    if spec.launcher == "docker":
        from harness.running.docker_launch import run_on_docker

        return run_on_docker(scenario, run_dir, plan, log, deadline, poll, owner_env=owner)
    # A process fault needs torchrun even for one rank: it restarts what was lost.
    elastic = any(type(f).fault_class == "process" for f in scenario.faults)
    early = spec.resume_after or spec.stop_after
    first = reference_command(spec, run_dir, plan, stop_after=early, elastic=elastic)
    launch = run_process(first, log=log, deadline=deadline, env=env, on_poll=poll, stop=stop)
    if spec.resume_after is None or launch.exit_code != 0:
        return launch
    second = reference_command(spec, run_dir, plan, resume=True, elastic=elastic)
    again = run_process(second, log=log, deadline=deadline, env=env, on_poll=poll, stop=stop)
    return Launch(
        again.exit_code,
        again.timed_out,
        launch.seconds + again.seconds,
        again.interrupted,
        left_behind=(launch.left_behind or 0) + (again.left_behind or 0),
        left_processes=launch.left_processes + again.left_processes,
        ended=again.ended,
    )
