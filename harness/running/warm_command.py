"""How warm starts (`harness.running.warm_start`) read a command: a torchrun command's
parts (torchrun's own argument parser reads it), and what a warm-start server imports beyond
torch for it: the installed modules a script imports (`preload_of`), or this checkout's
own modules for its own programs (`own_preload`)."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from harness.inside.crash_hook import installed
from harness.inside.forked_torchrun import TORCHRUN

#: `ast.parse` in two threads at once (a suite's scenarios launch from threads) raised
#: "SystemError: AST constructor recursion depth mismatch" on Python 3.11.
_parse_lock = threading.Lock()


class Torchrun(NamedTuple):
    """A ``python -m torch.distributed.run OPTIONS PROGRAM`` command, read by torchrun's own
    argument parser."""

    options: list[str]  # torchrun's, less -m
    worker: list[str]  # what torchrun runs as each worker: python -u [-m] PROGRAM ARGS
    processes: int  # nodes x processes per node; 0 when not a number here


def parse_torchrun(argv: Sequence[str]) -> Torchrun | None:
    """``argv``'s parts when it is ``python -m torch.distributed.run OPTIONS PROGRAM`` (with this
    interpreter, a program torchrun runs with Python), else None."""
    if len(argv) < 4 or argv[0] != sys.executable or list(argv[1:3]) != ["-m", TORCHRUN]:
        return None
    from torch.distributed.run import get_args_parser

    rest = list(argv[3:])
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = get_args_parser().parse_args(rest)
    except SystemExit:
        return None
    if args.no_python or args.run_path or args.training_script.startswith("-"):
        return None
    at = len(rest) - len(args.training_script_args) - 1
    options = [word for word in rest[:at] if word not in ("-m", "--module")]
    program = ["-m", args.training_script] if args.module else [args.training_script]
    worker = [sys.executable, "-u", *program, *args.training_script_args]
    nodes, per_node = str(args.nnodes).split(":")[-1], str(args.nproc_per_node)  # MIN:MAX
    processes = int(nodes) * int(per_node) if nodes.isdigit() and per_node.isdigit() else 0
    return Torchrun(options, worker, processes)


def preload_of(command: Sequence[str]) -> tuple[str, ...]:
    """What a server may import for ``command`` beyond torch (which every server imports):
    the installed modules (and the names taken from them) its script imports at its top
    level (``python SCRIPT.py``, or torchrun running one); else nothing. Never the
    program's own modules."""
    job = parse_torchrun(command)
    return script_preload(job.worker if job is not None else command)


def script_preload(command: Sequence[str]) -> tuple[str, ...]:
    """`preload_of` a command that is not torchrun's (``python [-u] SCRIPT.py ...``)."""
    script = next((w for w in command[1:] if not w.startswith("-")), "")
    if len(command) < 2 or command[0] != sys.executable or not script.endswith(".py"):
        return ()
    if command[1].startswith("-") and command[1] != "-u":
        return ()
    try:
        source = Path(script).read_bytes()
        with _parse_lock:  # CPython 3.11's parser is not safe in two threads at once
            tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return ()
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [f"{node.module}:{alias.name}" for alias in node.names]
    tops = {name: name.split(":")[0].split(".")[0] for name in dict.fromkeys(names)}
    return tuple(name for name, top in tops.items() if top != "torch" and _installed(top))


def _installed(top: str) -> bool:
    """``top`` is an installed package or module (`harness.inside.crash_hook.installed`),
    found without importing it."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin or "", *(spec.submodule_search_locations or [])]
    return any(installed(place) for place in places)


#: What a server imports beyond torch for this checkout's own programs (`OWN_PROGRAMS`):
#: the modules each of their processes imports (about 0.6 s of CPU after torch, on a 2-core
#: machine half of what a short rank costs). They come from this checkout, as the server's
#: own ``harness`` does; a request whose path would find another copy of them first is
#: refused (`harness.inside.warm_server`), and its client starts it afresh.
OWN_PRELOAD = (
    "reference_trainer.cli",
    "reference_trainer.train",
    "harness.commands.main",
    "harness.running.exec",
    # the fault kinds a run's plan is read with (their models are built when imported:
    # 0.16 s of CPU a run with faults)
    "faults.builtin",
    # and what a run imports at its first step (the near-duplicate filter's MinHash, the
    # phrase matcher, torch's save options): 0.05 s of CPU a one-step run
    "rensa",
    "ahocorasick",
    "torch.utils.serialization",
)
#: ``python -m reference_trainer``, ``python -m harness`` (the `tightrope` command).
OWN_PROGRAMS = ("reference_trainer", "harness")


def own_preload(argv: Sequence[str]) -> tuple[str, ...]:
    """`OWN_PRELOAD` when ``argv`` runs one of `OWN_PROGRAMS` (``python [-u] -m PROGRAM``,
    or torchrun running it), else nothing."""
    job = parse_torchrun(argv) if list(argv[1:3]) == ["-m", TORCHRUN] else None
    program = list(job.worker if job is not None else argv)[1:]
    program = program[1:] if program[:1] == ["-u"] else program
    own = len(program) >= 2 and program[0] == "-m" and program[1] in OWN_PROGRAMS
    return OWN_PRELOAD if own else ()
