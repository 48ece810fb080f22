"""An exploration: two fault-free runs (the first records the file events; if their
parameters differ, divergence verdicts mean nothing), then each point: a fresh run killed
there, resumed with the job's own resume, and judged against the fault-free run.

Points run in parallel within the cores given (one process per core per rank). Each point's
result is cached in its folder under the exploration's, keyed by the commands, the code and
the recorded events, so a stopped exploration goes on where it ended.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.crashpoints.evidence import (
    Ident,
    Trained,
    Unit,
    journal_records,
    journal_sizes,
    newest_complete,
    save_contents,
    saved_whole,
    trained,
)
from harness.crashpoints.job import Target, run_job
from harness.crashpoints.plan import (
    FileEvent,
    Point,
    killed_record,
    name_saves,
    read_events,
)
from harness.crashpoints.verdict import Outcome, classify
from harness.crashpoints.zygote import Zygote
from harness.errors import TightropeError
from harness.inside.crash_hook import log_path, point_spec
from harness.running.baseline import code_version
from harness.running.launch import log_tail

#: Bumped when what a cached point holds changes meaning.
CACHE_VERSION = 2


class CrashPointsError(TightropeError):
    """An exploration cannot go on (bad input, or a fault-free run that failed)."""


@dataclass(slots=True)
class FaultFree:
    """A fault-free run: its file events per rank and the agent's fingerprints per rank."""

    run_dir: Path
    events: dict[int, list[FileEvent]]
    prints: list[dict[int, str]]
    last_step: int | None
    #: Its checkpoints (`evidence.save_contents`).
    contents: list[Unit] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(slots=True)
class PointResult:
    """One point, judged."""

    point: Point
    verdict: str
    why: str
    outcome: Outcome
    seconds: float
    cached: bool = False


def _key(target: Target, extra: object) -> str:
    """What a cached run is valid for: the commands, the code, and ``extra``."""
    files = {}
    for word in (*target.train, *target.resume):
        path = Path(word)
        if path.suffix == ".py" and path.is_file():
            files[word] = hashlib.sha256(path.read_bytes()).hexdigest()
    data = {
        "v": CACHE_VERSION,
        "train": target.train,
        "resume": target.resume,
        "ranks": target.ranks,
        "grace": target.grace,
        "files": files,
        "code": code_version(),
        "extra": extra,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _fresh(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def fault_free(
    target: Target, folder: Path, *, use_cache: bool = True, zygote: Zygote | None = None
) -> FaultFree:
    """Run the job once with no fault, recording its file events (cached in ``folder``);
    forked from ``zygote`` when given."""
    run_dir, base, done = folder / "run", folder / "events", folder / "done.json"
    key = _key(target, "fault-free")
    cached = use_cache and done.is_file() and json.loads(done.read_text()).get("key") == key
    seconds = 0.0
    if not cached:
        _fresh(folder)
        end = run_job(
            target,
            target.train,
            run_dir,
            output=folder / "output.log",
            log_base=base,
            zygote=zygote,
        )
        seconds = end.seconds
        if end.exit_code != 0:
            how = "ran past its deadline" if end.timed_out else f"exited with {end.exit_code}"
            raise CrashPointsError(
                f"the fault-free run {how} before any crash was injected "
                f"({folder / 'output.log'}):\n{log_tail(folder / 'output.log', 15)}"
            )
    events: dict[int, list[FileEvent]] = {}
    prints: list[dict[int, str]] = []
    last: int | None = None
    saved: list[tuple[str, int]] = []
    for rank in range(target.ranks):
        seen = trained(journal_records(run_dir, rank))
        logged = read_events(Path(log_path(str(base), rank)), rank)
        events[rank] = name_saves(logged, seen.walls)
        prints.append(seen.prints)
        last = seen.last if rank == 0 else last
        for path, step in seen.saved:
            rel = _relative(path, run_dir)
            if rel is not None:
                saved.append((rel, step))
    merged = sorted((e for es in events.values() for e in es), key=lambda e: e.wall)
    contents = save_contents(merged, run_dir, saved)
    result = FaultFree(run_dir, events, prints, last, contents, seconds)
    if not cached:
        done.write_text(json.dumps({"key": key, "seconds": seconds}))
    else:
        result.seconds = float(json.loads(done.read_text()).get("seconds", 0.0))
    return result


def _relative(path: str, run_dir: Path) -> str | None:
    try:
        return str(Path(path).resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return None


def same_run(a: FaultFree, b: FaultFree) -> bool:
    """Two fault-free runs ended with the same parameters after every step, on every rank."""
    return a.last_step == b.last_step and a.prints == b.prints and bool(a.prints[0])


def _resumed_from(crash: Trained, resume: Trained, clean: FaultFree) -> int | None:
    if resume.order:
        return resume.order[0] - 1
    return crash.last if crash.last == clean.last_step else None


def _outcome(
    clean: FaultFree, run_dir: Path, sizes: list[int], ranks: int
) -> tuple[int | None, int | None, int | None, bool, int, list[dict[str, Any]], int | None]:
    """(killed after, resumed from, first difference, final matches, steps compared,
    loads, final step) from the journals of the crash run (before ``sizes``) and the
    resume (after)."""
    first: int | None = None
    matches = True
    loads: list[dict[str, Any]] = []
    head: tuple[Trained, Trained] | None = None
    for rank in range(ranks):
        crash = trained(journal_records(run_dir, rank, 0, sizes[rank]))
        resume = trained(journal_records(run_dir, rank, sizes[rank]))
        head = head or (crash, resume)
        for step in resume.order:
            if resume.prints.get(step) != clean.prints[rank].get(step):
                first = step if first is None else min(first, step)
        final = resume if resume.order else crash
        last = final.order[-1] if final.order else None
        want = clean.prints[rank].get(clean.last_step) if clean.last_step is not None else None
        if last is None or last != clean.last_step or final.prints.get(last) != want or not want:
            matches = False
        loads += [dict(d, rank=rank) if ranks > 1 else d for d in resume.loads]
    assert head is not None
    crash0, resume0 = head
    final0 = resume0 if resume0.order else crash0
    final_step = final0.order[-1] if final0.order else None
    resumed = _resumed_from(crash0, resume0, clean)
    return crash0.last, resumed, first, matches, len(resume0.order), loads, final_step


def _met(target: Target, point: Point, base: Path) -> tuple[bool, set[Ident]]:
    """Whether the point's rank died at the point's event, and the events (named alike in
    any run: `FileEvent.ident`) the crash run finished: on the point's rank those before the
    kill (a torn event did not finish either), on the others all but the last logged (it
    may have been under way)."""
    finished: set[Ident] = set()
    matched = False
    for rank in range(target.ranks):
        log = Path(log_path(str(base), rank))
        logged = read_events(log, rank)
        record = killed_record(log) if rank == point.rank else None
        if record is not None:
            dead = [e for e in logged if e.n == record.get("killed")]
            matched = bool(dead) and dead[0].ident == point.event.ident
            finished |= {e.ident for e in logged if e.n < int(record["killed"])}
        else:
            finished |= {e.ident for e in logged[:-1]}
    return matched, finished


def run_point(
    target: Target,
    clean: FaultFree,
    point: Point,
    folder: Path,
    halt: threading.Event | None = None,
    zygote: Zygote | None = None,
) -> PointResult:
    """Kill a fresh run at ``point``, resume it, judge it (both runs forked from
    ``zygote`` where it serves them)."""
    started = time.monotonic()
    run_dir, base = folder / "run", folder / "events"
    _fresh(folder)
    at = (point.rank, point_spec(point.rank, point.mode, point.event.occurrence, point.event.key))
    crash = run_job(
        target,
        target.train,
        run_dir,
        output=folder / "crash.log",
        log_base=base,
        at=at,
        halt=halt,
        zygote=zygote,
    )
    matched, finished = _met(target, point, base)
    record = killed_record(Path(log_path(str(base), point.rank)))
    saved = saved_whole(run_dir, target.ranks)
    newest = newest_complete(clean.contents, run_dir, finished, saved)
    sizes = journal_sizes(run_dir, target.ranks)
    resume = run_job(
        target, target.resume, run_dir, output=folder / "resume.log", halt=halt, zygote=zygote
    )
    after, resumed, first, matches, compared, loads, final = _outcome(
        clean, run_dir, sizes, target.ranks
    )
    torn = None
    if record is not None and record.get("mode") == "torn":
        torn = {"whole_bytes": record.get("whole_bytes"), "torn_bytes": record.get("torn_bytes")}
    outcome = Outcome(
        crash_exit=crash.exit_code,
        killed=crash.killed,
        event_matched=matched,
        resume_exit=resume.exit_code,
        resume_timed_out=resume.timed_out,
        newest_complete=newest,
        killed_after_step=after,
        resumed_from=resumed,
        first_difference=first,
        final_step=final,
        final_matches=matches,
        steps_compared=compared,
        loads=loads,
        torn=torn,
    )
    verdict, why = classify(outcome)
    return PointResult(point, verdict, why, outcome, time.monotonic() - started)


def _cached(folder: Path, key: str, point: Point) -> PointResult | None:
    path = folder / "result.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != key:
        return None
    fields = {k: v for k, v in data["evidence"].items() if k not in ("steps_redone", "steps_lost")}
    outcome = Outcome(**fields)
    return PointResult(point, data["verdict"], data["why"], outcome, data["seconds"], cached=True)


def _store(folder: Path, key: str, result: PointResult) -> None:
    data = {
        "key": key,
        "verdict": result.verdict,
        "why": result.why,
        "seconds": result.seconds,
        "evidence": result.outcome.document(),
    }
    (folder / "result.json").write_text(json.dumps(data, indent=1))


def point_key(target: Target, clean: FaultFree, point: Point) -> str:
    """The cache key of one point: its commands, the code, the recorded events, the point."""
    plan = {r: [e.key for e in es] for r, es in clean.events.items()}
    where = [point.rank, point.mode, point.event.n, point.event.occurrence]
    return _key(target, {"plan": plan, "point": where})


def run_points(
    target: Target,
    clean: FaultFree,
    points: list[Point],
    out: Path,
    *,
    cores: int,
    use_cache: bool = True,
    started: Callable[[Point], Any] | None = None,
    finished: Callable[[PointResult, Any], None] | None = None,
    warm: Callable[[], Zygote | None] | None = None,
    halt: threading.Event | None = None,
) -> list[PointResult]:
    """Every point of ``points`` (cached ones taken as they are), in parallel, forked from
    the zygote ``warm`` gives (called once, at the first point not cached; closed at the
    end). Stopped (Ctrl-C), the running points' jobs are killed and nothing of them is
    kept; so too once ``halt`` is set (a suite run stopped)."""
    halt = halt if halt is not None else threading.Event()
    zygotes: list[Zygote | None] = []
    lock = threading.Lock()

    def zygote() -> Zygote | None:  # started for the first point not cached
        with lock:
            if not zygotes:
                zygotes.append(None if warm is None else warm())
            return zygotes[0]

    def one(point: Point) -> PointResult | None:
        if halt.is_set():
            return None
        folder = out / "points" / point.slug
        key = point_key(target, clean, point)
        token = started(point) if started is not None else None
        result = _cached(folder, key, point) if use_cache else None
        if result is None:
            result = run_point(target, clean, point, folder, halt, zygote())
            if halt.is_set():
                return None
            _store(folder, key, result)
        if finished is not None:
            finished(result, token)
        return result

    workers = max(1, cores // max(1, target.ranks))
    try:
        with ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(one, p) for p in points]
            try:
                done = [f.result() for f in futures]
            except BaseException:
                halt.set()
                raise
    finally:
        for z in zygotes:
            if z is not None:
                z.close()
    return [r for r in done if r is not None]
