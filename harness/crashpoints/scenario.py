"""A suite's ``crashpoints:`` scenario (`harness.suites.crashpoints_spec`): the exploration
run as ``tightrope crashpoints`` runs it, its matrix written in the scenario's run dir, and
its outcome as a scenario result whose checks are its points.

A check per point, not one for the whole matrix: a suite's reports (scorecard, JUnit,
pytest's failure) then name each failing point with its verdict, its evidence in a line and
the command that runs it again, and the scenario's score is the share of its points that
passed, which is what the matrix measures.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness.crashpoints.exploration import Options, explore
from harness.crashpoints.explore import CrashPointsError, PointResult
from harness.crashpoints.job import Target
from harness.crashpoints.report import Matrix, write_matrix
from harness.oracles.verdict import Check
from harness.running.results import ScenarioResult
from harness.running.runner import INTERRUPTED
from harness.suites.crashpoints_spec import DEFAULT_GRACE, DEFAULT_TIMEOUT, CrashpointsSpec
from harness.suites.scenario import Scenario


def reproduction(spec: CrashpointsSpec, out: Path) -> Callable[[int], str]:
    """index -> the ``tightrope crashpoints`` command line that runs that point again."""
    head = ["tightrope", "crashpoints", "--out", str(out)]
    if spec.ranks != 1:
        head += ["--ranks", str(spec.ranks)]
    if spec.grace != DEFAULT_GRACE:
        head += ["--grace", f"{spec.grace:g}"]
    if spec.timeout != DEFAULT_TIMEOUT:
        head += ["--timeout", f"{spec.timeout:g}"]
    if spec.resume_command is not None:
        head += ["--resume-command", shlex.join(spec.resume_argv())]
    tail = ["--", *spec.train_argv()]
    return lambda i: shlex.join([*head, "--only", str(i), *tail])


def point_check(r: PointResult, m: Matrix, fail_on: list[str]) -> Check:
    """One point as a check: failed when its verdict is in ``fail_on``; a divergence of a
    job whose two fault-free runs differed is not judged (it means nothing then)."""
    label = r.point.label(m.ranks)
    if r.verdict == "SILENT_DIVERGENCE" and not m.deterministic:
        return Check(
            name=label,
            passed=False,
            figure=r.verdict,
            unit="",
            expected="not " + " or ".join(fail_on),
            detail="the job is not deterministic (two fault-free runs differ): "
            f"a divergence means nothing ({r.why})",
            judged=False,
        )
    failed = r.verdict in fail_on
    detail = r.why + (f"; reproduce: {m.reproduce(r.point.index)}" if failed else "")
    return Check(
        name=label,
        passed=not failed,
        figure=r.verdict,
        unit="",
        expected="not " + " or ".join(fail_on),
        detail=detail,
        figures={"index": r.point.index, "rank": r.point.rank, "mode": r.point.mode},
    )


def run_scenario(
    scenario: Scenario, out_dir: Path, cores: int, stop: threading.Event
) -> ScenarioResult:
    """Explore the scenario's crash points in ``out_dir``/runs/NAME; its result."""
    spec = scenario.crashpoints
    assert spec is not None, "not a crashpoints scenario"
    started = time.monotonic()
    result = ScenarioResult(
        name=scenario.name,
        fault_class=scenario.scored_class,
        weight=scenario.weight,
        checks=[],
        run_dir=f"runs/{scenario.name}",
        description=scenario.description,
        spec=scenario.model_dump(mode="json", by_alias=True, exclude_defaults=True),
    )
    out = out_dir / result.run_dir
    target = Target(
        tuple(spec.train_argv()), tuple(spec.resume_argv()), spec.ranks, True, spec.grace,
        spec.timeout,
    )  # fmt: skip
    options = Options(
        out=out,
        target=target,
        cores=cores,
        max_points=spec.max_points,
        reproduce=reproduction(spec, out),
        progress=False,
        stop=stop,
    )
    try:
        matrix = explore(options)
    except CrashPointsError as exc:
        result.error = str(exc)
    else:
        write_matrix(matrix, out, spec.fail_on)
        result.checks = [point_check(r, matrix, spec.fail_on) for r in matrix.results]
        result.metrics = {
            "crashpoints": matrix.summary(),
            "deterministic": matrix.deterministic,
            "points_total": matrix.points_total,
            "points_explored": len(matrix.results),
            "notes": list(matrix.notes),
        }
        if stop.is_set():
            result.error = INTERRUPTED
    result.seconds = time.monotonic() - started
    return result
