"""Checkpoint fuzzer: damage copies of a real run's checkpoints at random, resume each, and
judge what the resume picked against the known truth.

    .venv/bin/python -m tests.checkpoint_fuzzer --cases 1000 --seed 0 --cli-every 20

Two pristine runs are trained once with the reference trainer's CLI (this run, and another
with a different seed to copy checkpoints from). The truth is the digest of what loads
from each pristine checkpoint: every tensor's bytes and plain value of the state, and the
rank-0 RNG states the trainer restores. Each case copies this run, applies 1 to 3 mutations
(`tests.checkpoint_mutations`), and resumes in a forked child the way the trainer does
(``check_resumable``, then ``CheckpointManager.load_valid``); every ``--cli-every``-th case
also resumes with the real CLI. The oracle: a checkpoint is valid when it and its whole
delta parent chain are byte-identical to the pristine run's under their own names. A
resume must load the newest valid one (or something bit-identical to the truth of its
name), refuse only when none is valid, and never raise anything but a `TightropeError` or
hang. See docs/checkpoint-fuzzer.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from harness.running import warm_start
from reference_trainer.checkpoints.manager import CheckpointConfig
from tests.checkpoint_mutations import MUTATIONS, Target
from tests.checkpoint_truth import (
    MESSAGE_LIMIT,
    STEPS,
    FuzzerError,
    Loader,
    Outcome,
    Pristine,
    Resume,
    build_pristine,
    checkpoint_manager,
    content_digest,
    in_child,
    trainer_env,
    trainer_resume,
    tree_digests,
    valid_checkpoints,
)

ROOT = Path(__file__).resolve().parent.parent
PROG = "python -m tests.checkpoint_fuzzer"
Kind = Literal[
    "corrupt_load", "wrong_refusal", "rewound", "disagree", "traceback", "hang", "bad_exit"
]
Result = Literal["loaded", "benign", "fresh", "refused", "corrupt", "traceback", "hang"]
FAILURES: tuple[Kind, ...] = get_args(Kind)
OUTCOMES: tuple[Result, ...] = get_args(Result)
_STEP = re.compile(r"step-(\d{8})")


# -- the oracle ----------------------------------------------------------------------------


@dataclass(slots=True)
class Verdict:
    """One resume judged: its outcome and the failures found in it."""

    outcome: Result
    failures: list[tuple[Kind, str]] = field(default_factory=list)


def _step(name: str) -> int:
    match = _STEP.fullmatch(name)
    return int(match.group(1)) if match else -1


def judge_load(
    path: Path, digest: str | None, run_dir: Path, valid: set[str], pristine: Pristine
) -> Verdict:
    """A load of ``path``: valid, benign (bit-identical to the truth of its name) or
    corrupt; rewound when a newer checkpoint was valid."""
    name = path.name
    in_place = path.parent == RunLayout(run_dir).checkpoints
    truth = pristine.truth.get(name) if in_place else None
    if in_place and name in valid and digest == truth:
        verdict = Verdict("loaded")
    elif truth is not None and digest == truth:
        verdict = Verdict("benign")
    else:
        state = "a valid checkpoint" if name in valid and in_place else "not a valid checkpoint"
        return Verdict(
            "corrupt",
            [
                (
                    "corrupt_load",
                    f"loaded {path} ({state}) whose content is {pristine.describe(digest)}",
                )
            ],
        )
    newest = max(valid, key=_step, default=None)
    if newest is not None and _step(name) < _step(newest):
        verdict.failures.append(("rewound", f"loaded {name} although {newest} is valid"))
    return verdict


def judge_resume(outcome: Outcome, run_dir: Path, valid: set[str], pristine: Pristine) -> Verdict:
    """The in-process resume of one case."""
    newest = max(valid, key=_step, default=None)
    if outcome.status in ("traceback", "hang"):
        return Verdict(outcome.status, [(outcome.status, outcome.message)])
    if outcome.status == "refused":
        if newest is None:
            return Verdict("refused")
        return Verdict("refused", [("wrong_refusal", f"{outcome.message} ({newest} is valid)")])
    resume: Resume = outcome.value
    if resume.pick is None:
        if newest is None:
            return Verdict("fresh")
        return Verdict("fresh", [("rewound", f"would start over from step 0; {newest} is valid")])
    assert resume.path is not None
    verdict = judge_load(Path(resume.path), resume.digest, run_dir, valid, pristine)
    if Path(resume.pick) != Path(resume.path):
        verdict.failures.append(
            ("disagree", f"check_resumable picked {resume.pick}, load_valid loaded {resume.path}")
        )
    return verdict


# -- the real CLI --------------------------------------------------------------------------


def run_cli(run_dir: Path, timeout: float) -> tuple[int | None, str, str]:
    """``--resume`` the run with the reference trainer's CLI: its exit code (None on
    timeout, when the trainer's process group is killed), and the last MiB of its stdout
    and stderr (kept in files beside the run: a loader may print a 64 MiB ``latest``)."""
    top = max((_step(n) for n in os.listdir(RunLayout(run_dir).checkpoints)), default=STEPS)
    steps = str(max(top, STEPS) + 2)
    argv = [sys.executable, "-m", "reference_trainer", "--resume", "--run-dir", str(run_dir)]
    argv += ["--steps", steps, "--checkpoint-every", "1000", "--log-every", "1000"]
    with (
        open(run_dir.parent / "cli.out", "w+b") as out,
        open(run_dir.parent / "cli.err", "w+b") as err,
    ):
        env = trainer_env()  # forked warm when the test session is (tests/conftest.py)
        proc = subprocess.Popen(
            warm_start.warm(argv, env),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        code: int | None
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        return code, _last_mib(out), _last_mib(err)


def _last_mib(f: Any) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - (1 << 20)))
    return str(f.read().decode(errors="replace"))


def judge_cli(
    result: tuple[int | None, str, str],
    run_dir: Path,
    valid: set[str],
    pristine: Pristine,
    digest_of: Callable[[Path], str | None],
) -> Verdict:
    """The CLI's resume of one case, judged from its exit, stderr and journal."""
    code, out, err = result
    newest = max(valid, key=_step, default=None)
    if code is None:
        return Verdict("hang", [("hang", "the CLI did not finish")])
    if "Traceback" in err:
        return Verdict("traceback", [("traceback", _tail(err))])
    if code == 2:
        lines = err.strip().splitlines()
        verdict = Verdict("refused")
        if len(lines) != 1:
            verdict.failures.append(("bad_exit", f"exit 2 with {len(lines)} lines: {_tail(err)}"))
        if newest is not None:
            verdict.failures.append(("wrong_refusal", f"{_tail(err)} ({newest} is valid)"))
        return verdict
    if code != 0:
        return Verdict("traceback", [("bad_exit", f"exit code {code}: {_tail(err or out)}")])
    loaded = [e for e in read_journal(run_dir, warn=False) if e.kind == "checkpoint_loaded"]
    if not loaded:
        if newest is None:
            return Verdict("fresh")
        return Verdict("fresh", [("rewound", f"exit 0 without loading; {newest} is valid")])
    path = Path(str(loaded[0]["path"]))
    return judge_load(path, digest_of(path), run_dir, valid, pristine)


def _tail(text: str) -> str:
    lines = text.strip().splitlines()
    return (lines[-1] if lines else "")[:300]


# -- a case and a campaign -----------------------------------------------------------------


@dataclass(slots=True)
class CaseResult:
    """One case: its mutations and the verdicts of the in-process and CLI resumes."""

    case: int
    mutations: list[tuple[str, str]]
    """(kind, what it did) of each mutation, in order."""
    resume: Verdict
    cli: Verdict | None = None
    seconds: float = 0.0
    """Copy, damage, in-process resume and judgement (not the CLI)."""
    cli_seconds: float = 0.0

    @property
    def failures(self) -> list[tuple[str, Kind, str]]:
        """(where, kind, message) of every failure of the case."""
        found = [("load", k, m) for k, m in self.resume.failures]
        return found + [("cli", k, m) for k, m in (self.cli.failures if self.cli else [])]


@dataclass(kw_only=True, slots=True)
class Settings:
    """One campaign's knobs (the CLI's flags)."""

    seed: int = 0
    first: int = 0
    cases: int = 1000
    cli_every: int = 20
    """Every this-many-th case also resumes through the CLI (0: never)."""
    kinds: tuple[str, ...] = tuple(MUTATIONS)
    timeout: float = 30.0
    """Seconds an in-process resume may take before it counts as a hang."""
    cli_timeout: float = 120.0
    scratch: Path | None = None
    """Folder the cases are copied into and damaged (default: the system's temporary one);
    each case writes and deletes a copy of the run, so a memory-backed one saves disk time."""


def run_case(
    case: int, settings: Settings, pristine: Pristine, work: Path, load: Loader
) -> CaseResult:
    """Copy the run, damage it, resume it, judge."""
    started = time.monotonic()
    rng = random.Random(f"{settings.seed}:{case}")
    folder = work / f"case-{case}"
    run, outside = folder / "run", folder / "outside"
    shutil.copytree(pristine.run, run, symlinks=True)
    outside.mkdir()
    try:
        target = Target(rng, run, outside, pristine.other)
        mutations: list[tuple[str, str]] = []
        for _ in range(rng.randint(1, 3)):
            while True:
                kind = rng.choice(settings.kinds)
                done = MUTATIONS[kind](target)
                if done is not None:
                    mutations.append((kind, done))
                    break
        valid = valid_checkpoints(run, pristine)
        outcome = in_child(lambda: load(run), settings.timeout)
        verdict = _shorten(judge_resume(outcome, run, valid, pristine), run)
        result = CaseResult(case, mutations, verdict, seconds=time.monotonic() - started)
        if settings.cli_every and case % settings.cli_every == 0:
            digest_of = _digest_lookup(outcome, settings.timeout)
            cli = run_cli(run, settings.cli_timeout)
            result.cli = _shorten(judge_cli(cli, run, valid, pristine, digest_of), run)
            result.cli_seconds = time.monotonic() - started - result.seconds
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _shorten(verdict: Verdict, run: Path) -> Verdict:
    """The case's temporary run dir written as RUN (its folder as CASE) in every message,
    each cut to `MESSAGE_LIMIT` characters."""
    verdict.failures = [
        (k, m.replace(str(run), "RUN").replace(str(run.parent), "CASE")[:MESSAGE_LIMIT])
        for k, m in verdict.failures
    ]
    return verdict


def _digest_lookup(outcome: Outcome, timeout: float) -> Callable[[Path], str | None]:
    """Content digest of a checkpoint the CLI loaded: the in-process one when it loaded the
    same folder, else loaded again without verification (None when even that fails)."""
    known = outcome.value if outcome.status == "ok" else None

    def digest_of(path: Path) -> str | None:
        if isinstance(known, Resume) and known.path == str(path):
            return known.digest
        trusting = checkpoint_manager(path.parent.parent, CheckpointConfig(integrity=False))
        again = in_child(lambda: content_digest(path, trusting.load(path)), timeout)
        return str(again.value) if again.status == "ok" else None

    return digest_of


@dataclass(slots=True)
class Report:
    """A campaign's cases, counted and rendered."""

    settings: Settings
    results: list[CaseResult]
    seconds: float
    build_seconds: float = 0.0
    """Training the pristine runs and recording their truth."""

    def mutations(self) -> Counter[str]:
        """How often each mutation kind was applied."""
        return Counter(kind for r in self.results for kind, _ in r.mutations)

    def outcomes(self, where: str) -> Counter[str]:
        """Outcome counts of the in-process (``load``) or ``cli`` resumes."""
        verdicts = [r.resume if where == "load" else r.cli for r in self.results]
        return Counter(v.outcome for v in verdicts if v is not None)

    def failures(self, where: str | None = None) -> Counter[str]:
        """Failure counts by kind, of one side or (None) both; a kind counts once a case."""
        return Counter(
            kind
            for r in self.results
            for kind in {k for w, k, _ in r.failures if where in (None, w)}
        )

    @property
    def failing(self) -> list[CaseResult]:
        """The cases with at least one failure."""
        return [r for r in self.results if r.failures]

    def _mean(self, name: str) -> float:
        """Mean of a per-case timing over the cases that have it."""
        values = [getattr(r, name) for r in self.results if getattr(r, name)]
        return sum(values) / len(values) if values else 0.0

    def reproduce(self, result: CaseResult) -> str:
        """The command that runs exactly this case again."""
        s = self.settings
        line = f"{PROG} --seed {s.seed} --first {result.case} --cases 1"
        line += " --cli-every 1" if result.cli is not None else " --cli-every 0"
        if s.kinds != tuple(MUTATIONS):
            line += f" --kinds {','.join(s.kinds)}"
        return line

    def to_json(self) -> dict[str, Any]:
        """Everything counted, and every failing case with its reproduction."""
        return {
            "seed": self.settings.seed,
            "first": self.settings.first,
            "cases": len(self.results),
            "cli_cases": sum(r.cli is not None for r in self.results),
            "seconds": round(self.seconds, 2),
            "build_seconds": round(self.build_seconds, 2),
            "seconds_a_case": round(self._mean("seconds"), 3),
            "seconds_a_cli_resume": round(self._mean("cli_seconds"), 2),
            "mutations": dict(self.mutations()),
            "outcomes": {w: dict(self.outcomes(w)) for w in ("load", "cli")},
            "failures": {w: dict(self.failures(w)) for w in ("load", "cli")},
            "failing_cases": [
                {
                    "case": r.case,
                    "mutations": [m for _, m in r.mutations],
                    "failures": [{"where": w, "kind": k, "message": m} for w, k, m in r.failures],
                    "reproduce": self.reproduce(r),
                }
                for r in self.failing
            ],
        }

    def render(self, show: int = 5) -> str:
        """The summary table, and one example of every failure kind seen."""
        n = len(self.results)
        cli = sum(r.cli is not None for r in self.results)
        lines = [
            f"checkpoint fuzzer: seed {self.settings.seed}, cases {self.settings.first}.."
            f"{self.settings.first + n - 1}: {n} cases ({cli} also through the CLI) in "
            f"{self.seconds:.1f} s",
            f"  {self._mean('seconds'):.2f} s a case in process, {self._mean('cli_seconds'):.1f} s "
            f"a CLI resume, {self.build_seconds:.1f} s to train the pristine runs",
            "",
            f"{'mutation':<16}{'count':>7}",
        ]
        counts = self.mutations()
        lines += [f"  {kind:<14}{counts[kind]:>7}" for kind in MUTATIONS]
        load, cli_out = self.outcomes("load"), self.outcomes("cli")
        lines += ["", f"{'outcome':<16}{'load':>7}{'cli':>7}"]
        lines += [f"  {o:<14}{load[o]:>7}{cli_out[o]:>7}" for o in OUTCOMES]
        lf, cf = self.failures("load"), self.failures("cli")
        lines += ["", f"{'failure':<16}{'load':>7}{'cli':>7}"]
        lines += [f"  {k:<14}{lf[k]:>7}{cf[k]:>7}" for k in FAILURES]
        failing = self.failing
        lines += ["", f"failing cases: {len(failing)} of {n}"]
        shown: list[CaseResult] = []
        for kind in FAILURES:  # the first case of each kind, then the first few others
            first = next((r for r in failing if any(k == kind for _, k, _ in r.failures)), None)
            if first is not None and first not in shown:
                shown.append(first)
        shown += [r for r in failing if r not in shown][: max(0, show - len(shown))]
        for r in sorted(shown, key=lambda r: r.case):
            lines.append(f"  case {r.case}:")
            lines += [f"    [{w}] {k}: {m[:300]}" for w, k, m in r.failures]
            lines += [f"    mutation: {m}" for _, m in r.mutations]
            lines.append(f"    reproduce: {self.reproduce(r)}")
        return "\n".join(lines)


def fuzz(
    settings: Settings,
    *,
    load: Loader = trainer_resume,
    pristine: Pristine | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Run a campaign; builds the pristine runs unless given them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no OpenMP pool in the parent: forked children must not hang
    work = Path(tempfile.mkdtemp(prefix="tightrope-fuzz-", dir=settings.scratch))
    started = time.monotonic()
    try:
        built = 0.0
        if pristine is None:
            pristine = build_pristine(work / "pristine")
            built = time.monotonic() - started
        before = tree_digests(pristine.run), tree_digests(pristine.other)
        _control(pristine, work, load, settings.timeout)
        results = []
        for i, case in enumerate(range(settings.first, settings.first + settings.cases), 1):
            results.append(run_case(case, settings, pristine, work, load))
            if progress is not None and (i % 50 == 0 or i == settings.cases):
                bad = sum(bool(r.failures) for r in results)
                spent = time.monotonic() - started
                progress(f"{i}/{settings.cases} cases, {bad} failing, {spent:.0f} s")
        if (tree_digests(pristine.run), tree_digests(pristine.other)) != before:
            raise FuzzerError("a case changed the pristine runs: their files differ now")
        return Report(settings, results, time.monotonic() - started, built)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        torch.set_num_threads(threads)


def _control(pristine: Pristine, work: Path, load: Loader, timeout: float) -> None:
    """An undamaged copy must resume from its newest checkpoint, or nothing is judged."""
    run = work / "control"
    shutil.copytree(pristine.run, run, symlinks=True)
    try:
        valid = valid_checkpoints(run, pristine)
        verdict = judge_resume(in_child(lambda: load(run), timeout), run, valid, pristine)
    finally:
        shutil.rmtree(run, ignore_errors=True)
    if verdict.outcome != "loaded" or verdict.failures:
        raise FuzzerError(f"an undamaged copy of the run does not resume: {verdict}")


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in MUTATIONS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown mutation kind(s) {unknown}; expected some of {', '.join(MUTATIONS)}"
        )
    return kinds


def _count(text: str, least: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The fuzzer's command line."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument(
        "--cases", type=lambda v: _count(v, 1), default=1000, help="how many (default 1000)"
    )
    p.add_argument("--seed", type=_count, default=0, help="campaign seed (default 0)")
    p.add_argument("--first", type=_count, default=0, help="number of the first case")
    p.add_argument(
        "--cli-every", type=_count, default=20, help="every N-th case also via the CLI (0: never)"
    )
    p.add_argument("--kinds", type=_kinds, default=tuple(MUTATIONS), help="mutation kinds, a,b")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per in-process resume")
    p.add_argument("--cli-timeout", type=float, default=120.0, help="seconds per CLI resume")
    p.add_argument("--scratch", type=Path, help="folder to damage the copies in (a tmpfs: faster)")
    p.add_argument("--json", type=Path, metavar="OUT.json", help="write the counts here")
    p.add_argument("--show", type=_count, default=5, help="failing cases to list (default 5)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: 0 when no case failed, 1 when one did, 2 when the fuzzer could not run."""
    args = build_parser().parse_args(argv)
    settings = Settings(
        seed=args.seed,
        first=args.first,
        cases=args.cases,
        cli_every=args.cli_every,
        kinds=args.kinds,
        timeout=args.timeout,
        cli_timeout=args.cli_timeout,
        scratch=args.scratch,
    )
    try:
        report = fuzz(settings, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except FuzzerError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(report.render(args.show))
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return 1 if report.failing else 0


if __name__ == "__main__":
    sys.exit(main())
