"""``tightrope crashpoints [OPTIONS] [-- CMD ... {run_dir} ...]``: kill a job at every file
event of its saves (and tear the files it writes), resume it with its own resume, and
classify each point PASS / HARD_FAIL / SILENT_DIVERGENCE / LOST_WORK (docs/crashpoints.md).

Without a command the reference trainer is the target (``--preset``, ``--steps``,
``--checkpoint-every``, ``--seed``), resumed with its own ``--resume``. Writes
``DIR/crashpoints.json``, ``crashpoints.md`` and ``junit.xml``. Exit 1 when a point's verdict
is in ``--fail-on``, 0 otherwise, 2 on bad input, 130 when stopped (finished points are
cached: the same command goes on).
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from harness.commands.suite import _cores, interrupt
from harness.crashpoints.verdict import VERDICTS
from harness.suites.crashpoints_spec import DEFAULT_FAIL_ON, DEFAULT_GRACE, DEFAULT_TIMEOUT

PLACEHOLDER = "{run_dir}"


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a number above 0, got {text}")
        return value

    return parse


def _indices(text: str) -> list[int]:
    words = [w.strip() for w in text.split(",")]
    if not words or not all(w.isdigit() for w in words):
        raise argparse.ArgumentTypeError(f"expected point numbers like 3 or 3,7, got {text!r}")
    return [int(w) for w in words]


def _verdicts(text: str) -> list[str]:
    words = [w.strip().upper() for w in text.split(",") if w.strip()]
    wrong = [w for w in words if w not in VERDICTS]
    if wrong or not words:
        raise argparse.ArgumentTypeError(
            f"unknown verdict {', '.join(wrong) or repr(text)}; choose from {', '.join(VERDICTS)}"
        )
    return words


def add_commands(commands: Any) -> None:
    """Add ``crashpoints`` to the ``tightrope`` parser."""
    p = commands.add_parser(
        "crashpoints",
        help="kill a job at every file event of its saves, resume it, classify each point",
        description="Record the file events of a fault-free run's saves, then kill a fresh "
        "run at each (and tear each file whose writer is observed), resume it with the job's "
        "own resume and classify the point PASS, HARD_FAIL, SILENT_DIVERGENCE or LOST_WORK "
        "from tightrope's own evidence. Without '-- CMD' the reference trainer is the target. "
        "Exit 1 when a verdict is in --fail-on, 0 otherwise, 2 on bad input, 130 stopped.",
    )
    p.add_argument("--out", type=Path, metavar="DIR", help="where runs and the matrix go")
    p.add_argument("--cores", type=_cores, metavar="N", help="cores to fill (default: all)")
    p.add_argument("--max-points", type=_positive(int), metavar="N", help="an even sample")
    p.add_argument("--only", type=_indices, metavar="N[,N...]", help="these points only")
    p.add_argument(
        "--fail-on",
        type=_verdicts,
        default=list(DEFAULT_FAIL_ON),
        metavar="VERDICT[,...]",
        help="verdicts that make the exit code 1, any case (default: hard_fail,silent_divergence)",
    )
    p.add_argument(
        "--ranks", type=_positive(int), default=1, metavar="N",
        help="ranks of the job (the command includes its torchrun); each in turn dies",
    )  # fmt: skip
    p.add_argument(
        "--grace", type=_positive(float), default=DEFAULT_GRACE, metavar="SECONDS",
        help="how long the other ranks go on after one dies (default: 3)",
    )  # fmt: skip
    p.add_argument(
        "--resume-command", metavar="'CMD ... {run_dir} ...'",
        help="how the job restarts (default: the train command again)",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=_positive(float), default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help="a run past this is killed; a resume past it is a HARD_FAIL (default: 600)",
    )  # fmt: skip
    p.add_argument("--no-cache", action="store_true", help="run every point again")
    p.add_argument("--json", action="store_true", help="print crashpoints.json on stdout")
    ref = p.add_argument_group("the reference trainer (without '-- CMD')")
    ref.add_argument("--preset", metavar="NAME", help="tiny (default) or small")
    ref.add_argument("--steps", type=_positive(int), metavar="N", help="default: 12")
    ref.add_argument("--checkpoint-every", type=_positive(int), metavar="N", help="default: 4")
    ref.add_argument("--seed", type=int, metavar="N", help="default: 0")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS ... {run_dir} ...")
    p.set_defaults(handler=_crashpoints)


class _BadInput(Exception):
    pass


def _reference(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    argv = [sys.executable]
    if args.ranks > 1:
        argv += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
        argv += [str(args.ranks), "--max-restarts", "0"]
    argv += ["-m", "reference_trainer", "--run-dir", PLACEHOLDER]
    argv += ["--preset", args.preset or "tiny", "--seed", str(args.seed or 0)]
    argv += ["--steps", str(args.steps or 12), "--checkpoint-every"]
    argv += [str(args.checkpoint_every or 4)]
    return argv, [*argv, "--resume"]


def commands_of(args: argparse.Namespace) -> tuple[list[str], list[str], bool]:
    """(train, resume, through the agent's bootstrap), checked."""
    given = args.command
    if given and given[0] == "--":
        given = given[1:]
        if not given:
            raise _BadInput("no command after '--' (tightrope crashpoints -- python train.py ...)")
    elif given:
        raise _BadInput(f"unexpected {given[0]!r}: put the job's command after '--'")
    if not given:
        if args.resume_command is not None:
            raise _BadInput("--resume-command needs the job's command after '--'")
        train, resume = _reference(args)
        return train, resume, False
    flags = [f for f in ("preset", "steps", "checkpoint_every", "seed") if getattr(args, f)]
    if flags:
        named = ", ".join("--" + f.replace("_", "-") for f in flags)
        raise _BadInput(f"{named}: for the reference trainer only, not with a command")
    if not any(PLACEHOLDER in w for w in given):
        raise _BadInput(f"the command has no {PLACEHOLDER}: put it where the job takes its run dir")
    resume = list(given)
    if args.resume_command is not None:
        try:
            resume = shlex.split(args.resume_command)
        except ValueError as exc:
            raise _BadInput(f"--resume-command cannot be split: {exc}") from None
        if not resume or not any(PLACEHOLDER in w for w in resume):
            raise _BadInput(f"--resume-command has no {PLACEHOLDER}")
    return list(given), resume, True


def reproduction(args: argparse.Namespace, out: Path) -> Any:
    """index -> the command line that runs that one point again."""
    head = ["tightrope", "crashpoints", "--out", str(out)]
    defaults = {"ranks": 1, "grace": DEFAULT_GRACE, "timeout": DEFAULT_TIMEOUT}
    for flag in ("ranks", "grace", "timeout", "preset", "steps", "checkpoint_every", "seed"):
        value = getattr(args, flag)
        if value is not None and value != defaults.get(flag):
            head += ["--" + flag.replace("_", "-"), str(value)]
    if args.resume_command is not None:
        head += ["--resume-command", args.resume_command]
    tail = ["--", *args.command[1:]] if args.command else []
    return lambda i: shlex.join([*head, "--only", str(i), *tail])


def _crashpoints(args: argparse.Namespace) -> int:
    from harness.crashpoints.exploration import Options, explore
    from harness.crashpoints.explore import CrashPointsError
    from harness.crashpoints.job import Target
    from harness.crashpoints.report import write_matrix

    try:
        train, resume, attach = commands_of(args)
    except _BadInput as exc:
        print(f"tightrope crashpoints: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / "crashpoints"
    target = Target(tuple(train), tuple(resume), args.ranks, attach, args.grace, args.timeout)
    cores = args.cores or _all_cores()
    options = Options(
        out=out,
        target=target,
        cores=cores,
        max_points=args.max_points,
        only=args.only,
        use_cache=not args.no_cache,
        reproduce=reproduction(args, out),
    )
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        matrix = explore(options)
    except CrashPointsError as exc:
        print(f"tightrope crashpoints: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stopped: finished points are kept; run the same command to go on", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    paths = write_matrix(matrix, out, args.fail_on)
    _print(matrix, paths, args)
    return 1 if matrix.failing(args.fail_on) else 0


def _all_cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _print(matrix: Any, paths: list[Path], args: argparse.Namespace) -> None:
    from harness.crashpoints.report import document

    if args.json:
        from harness.commands.json_output import emit_json

        emit_json(document(matrix))
        return
    s = matrix.summary()
    print(
        "crash points: "
        + "  ".join(f"{v} {s[v]}" for v in VERDICTS)
        + f"  ({len(matrix.results)} of {matrix.points_total} points, "
        f"{matrix.wall_seconds:.0f} s, deterministic: {'yes' if matrix.deterministic else 'NO'})"
    )
    for note in matrix.notes:
        print(f"note: {note}")
    for r in matrix.failing(args.fail_on):
        print(f"  {r.point.label(matrix.ranks)}: {r.verdict} ({r.why})")
        print(f"    reproduce: {matrix.reproduce(r.point.index)}")
    print("matrix: " + "  ".join(str(p) for p in paths))
