"""``tightrope crashpoints`` from start to end: the two fault-free runs, the points chosen
(all, an even sample, or the ones asked for), each run and judged with a progress bar on
stderr, and the matrix."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.crashpoints.explore import (
    CrashPointsError,
    FaultFree,
    PointResult,
    fault_free,
    run_points,
    same_run,
)
from harness.crashpoints.job import Target
from harness.crashpoints.plan import Point, all_points, spread
from harness.crashpoints.report import Matrix
from harness.crashpoints.warm import warm_zygote
from harness.crashpoints.zygote import Zygote


@dataclass(slots=True)
class Options:
    """What to explore and how."""

    out: Path
    target: Target
    cores: int = 1
    max_points: int | None = None
    only: list[int] | None = None
    use_cache: bool = True
    reproduce: Callable[[int], str] = field(default=lambda i: f"--only {i}")
    #: Show a progress bar on stderr.
    progress: bool = True
    #: Set to stop (a suite run stopped): running points are killed, none is begun.
    stop: threading.Event | None = None


def choose(points: list[Point], options: Options) -> list[Point]:
    """The points to run: those of ``--only`` (an index out of range is an error), else
    at most ``--max-points`` spread evenly."""
    if options.only is not None:
        wrong = [i for i in options.only if not 0 <= i < len(points)]
        if wrong:
            raise CrashPointsError(
                f"--only {','.join(map(str, wrong))}: out of range; this job has "
                f"{len(points)} crash points, numbered 0 to {len(points) - 1}"
            )
        return [points[i] for i in sorted(set(options.only))]
    if options.max_points is not None:
        return spread(points, options.max_points)
    return points


def _fault_free_pair(options: Options) -> tuple[FaultFree, FaultFree]:
    names = ("fault-free-1", "fault-free-2")
    if options.cores >= 2 * options.target.ranks:
        with ThreadPoolExecutor(2) as pool:
            runs = list(
                pool.map(
                    lambda n: fault_free(
                        options.target, options.out / n, use_cache=options.use_cache
                    ),
                    names,
                )
            )
        return runs[0], runs[1]
    first = fault_free(options.target, options.out / names[0], use_cache=options.use_cache)
    return first, fault_free(options.target, options.out / names[1], use_cache=options.use_cache)


def _notes(a: FaultFree, b: FaultFree, deterministic: bool) -> list[str]:
    notes = []
    if not deterministic:
        notes.append(
            "two fault-free runs ended with different parameters (the agent's fingerprints "
            "differ): SILENT_DIVERGENCE verdicts mean nothing until the job is deterministic"
        )
    if {r: [e.key for e in es] for r, es in a.events.items()} != {
        r: [e.key for e in es] for r, es in b.events.items()
    }:
        notes.append(
            "the two fault-free runs made different file events: a point's event may not be "
            "met at its number (see each point's evidence.event_matched)"
        )
    return notes


def explore(options: Options) -> Matrix:
    """Run the exploration ``options`` describe; the matrix of what it found."""
    started = time.monotonic()
    a, b = _fault_free_pair(options)
    deterministic = same_run(a, b)
    if not any(a.events.values()):
        raise CrashPointsError(
            "the job made no file event under its run dir: does it save there ({run_dir})?"
        )
    points = all_points(a.events, options.target.ranks)
    chosen = choose(points, options)
    notes = _notes(a, b, deterministic)
    results = _run(options, (a, b), chosen, notes)
    return Matrix(
        deterministic=deterministic,
        wall_seconds=time.monotonic() - started,
        results=results,
        ranks=options.target.ranks,
        reproduce=options.reproduce,
        points_total=len(points),
        file_events={rank: len(es) for rank, es in a.events.items()},
        notes=notes,
    )


def _run(
    options: Options, fresh: tuple[FaultFree, FaultFree], chosen: list[Point], notes: list[str]
) -> list[PointResult]:
    clean = fresh[0]

    def warm() -> Zygote | None:
        return warm_zygote(options.target, fresh, options.out, notes, use_cache=options.use_cache)

    if not options.progress:
        return run_points(
            options.target,
            clean,
            chosen,
            options.out,
            cores=options.cores,
            use_cache=options.use_cache,
            warm=warm,
            halt=options.stop,
        )
    from harness.running.progress import SuiteProgress

    ranks = options.target.ranks
    with SuiteProgress(len(chosen), f"crash points ({len(chosen)})") as bar:

        def begin(point: Point) -> Any:
            return bar.start(point.label(ranks), 1)

        def end(result: PointResult, task: Any) -> None:
            cached = " (cached)" if result.cached else ""
            line = f"{result.point.label(ranks)}: {result.verdict}{cached} ({result.why})"
            bar.finish(task, line)

        return run_points(
            options.target,
            clean,
            chosen,
            options.out,
            cores=options.cores,
            use_cache=options.use_cache,
            started=begin,
            finished=end,
            warm=warm,
            halt=options.stop,
        )
