"""The ``tightrope`` command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic_core import PydanticUndefined

from faults import FAULT_CLASSES, FaultSpec, kinds, yaml_input
from faults.registry import FaultKind
from faults.spec import TRIGGERS
from harness import __version__
from harness.commands.checklist import add_commands as add_checklist_commands
from harness.commands.crashpoints import add_commands as add_crashpoints_commands
from harness.commands.export import add_commands as add_export_commands
from harness.commands.json_output import (
    emit_json,
    faults_document,
    status_document,
    summary_document,
)
from harness.commands.review import add_commands as add_review_commands
from harness.commands.soak import add_commands as add_soak_commands
from harness.commands.suite import add_commands as add_suite_commands
from harness.commands.sweep import add_commands as add_sweep_commands
from harness.commands.watch import add_commands as add_watch_commands
from harness.commands.watch import rank_number
from harness.errors import TightropeError
from harness.live.control import MAX_IN_STEPS, ControlError, send, wait_for_answer
from harness.records.journal import read_journal
from harness.records.status import job_status
from harness.records.summary import summarize


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser with every command that exists so far."""
    parser = _Parser(
        prog="tightrope",
        description="Chaos engineering and stability testing for large-model training.",
    )
    parser.add_argument("--version", action="version", version=f"tightrope {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    summary = commands.add_parser(
        "summary", help="summarize a run from its journal (loss, steps, throughput)"
    )
    summary.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    summary.add_argument(
        "--json", action="store_true", help="one JSON document on stdout (docs/json.md)"
    )
    summary.set_defaults(handler=_summary)
    listing = commands.add_parser("faults", help="list every fault kind with its parameters")
    listing.add_argument(
        "--json", action="store_true", help="one JSON document on stdout (docs/json.md)"
    )
    listing.set_defaults(handler=_faults)
    inject = commands.add_parser(
        "inject",
        help="arm a fault in a running job",
        description="Arm a fault in a running job; prints the step at which it takes effect "
        "(the same on every rank). Exit 0 when armed, 1 when the job refused or did not "
        "answer, 2 on bad input.",
    )
    inject.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    inject.add_argument("kind", metavar="KIND", help="fault kind (see `tightrope faults`)")
    inject.add_argument("params", nargs="*", metavar="NAME=VALUE", help="fault parameters")
    inject.add_argument(
        "--rank", type=rank_number, help="hit this rank only (default: the kind's own)"
    )
    inject.add_argument(
        "--in-steps",
        type=_in_steps,
        default=1,
        metavar="K",
        help=f"take effect K steps from now (0 to {MAX_IN_STEPS})",
    )
    inject.add_argument(
        "--wait",
        type=_wait_seconds,
        default=30.0,
        metavar="S",
        help=f"seconds to wait for the job (at most {MAX_WAIT_SECONDS:g})",
    )
    inject.set_defaults(handler=_inject)
    status = commands.add_parser("status", help="step, loss, armed and fired faults of a job")
    status.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    status.add_argument(
        "--json", action="store_true", help="one JSON document on stdout (docs/json.md)"
    )
    status.set_defaults(handler=_status)
    execute = commands.add_parser(
        "exec", help="run a training command with the agent attached (no code change)"
    )
    execute.add_argument("--run-dir", type=Path, required=True, metavar="RUN_DIR")
    execute.add_argument("--plan", type=Path, metavar="PLAN", help="fault plan (YAML)")
    execute.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="kill the command's whole process group after SECONDS and exit 124",
    )
    execute.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    execute.set_defaults(handler=_exec)
    add_suite_commands(commands)
    add_review_commands(commands)
    add_soak_commands(commands)
    add_sweep_commands(commands)
    add_watch_commands(commands)
    add_checklist_commands(commands)
    add_export_commands(commands)
    add_crashpoints_commands(commands)
    return parser


#: The longest ``inject --wait``: a day (a job that does not answer in a day will not).
MAX_WAIT_SECONDS = 86_400.0


def _in_steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of steps, got {text!r}") from None
    if not 0 <= value <= MAX_IN_STEPS:
        raise argparse.ArgumentTypeError(f"expected 0 to {MAX_IN_STEPS} steps, got {text}")
    return value


def _wait_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number), got {text!r}") from None
    if not 0 < value <= MAX_WAIT_SECONDS:  # NaN fails this too
        raise argparse.ArgumentTypeError(
            f"expected seconds greater than 0 and at most {MAX_WAIT_SECONDS:g}, got {text}"
        )
    return value


def _exec(args: argparse.Namespace) -> int:
    from harness.running.exec import run_command

    return run_command(args.command, run_dir=args.run_dir, plan=args.plan, timeout=args.timeout)


def _parse_params(pairs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise ControlError(f"parameter {pair!r} is not NAME=VALUE")
        if not text.strip():
            raise ControlError(f"parameter {name} is empty; give a value or leave it out")
        try:
            value = yaml_input.load(text, f"parameter {name}")
        except yaml.YAMLError:
            value = text  # not a YAML scalar (`*.pt`, `!!python/...`): the text itself
        if not isinstance(value, (str, int, float, bool, list)) or (
            isinstance(value, list) and not all(isinstance(v, (str, int, float)) for v in value)
        ):
            raise ControlError(
                f"parameter {name}: {text!r} is not a number, a word or a list of them"
            )
        params[name] = value
    return params


def _inject(args: argparse.Namespace) -> int:
    fault = {"kind": args.kind, **_parse_params(args.params)}
    if args.rank is not None:
        fault["ranks"] = [args.rank]
    command = send(args.run_dir, fault, in_steps=args.in_steps)
    answer = wait_for_answer(args.run_dir, command.id, args.wait)
    if answer is None:
        print(
            f"tightrope: no answer from the job in {args.run_dir} within {args.wait:g} s "
            "(is it running?); the command was withdrawn",
            file=sys.stderr,
        )
        return 1
    if not answer.accepted:
        print(f"tightrope: the job refused {command.id}: {answer.reason}", file=sys.stderr)
        return 1
    print(
        f"{command.id}: {args.kind} armed for step {answer.effective_step} "
        f"(the job was at step {answer.step})"
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    state = job_status(read_journal(args.run_dir, warn=False))
    if args.json:
        emit_json(status_document(state, args.run_dir))
        return 0
    loss = f"{state.loss:.4f}" if state.loss is not None else "-"
    print(f"run      {args.run_dir} ({'running' if state.running else 'not running'})")
    print(f"step     {state.step}   loss {loss}")
    for armed in state.armed:
        print(f"armed    {armed.fault} at step {armed.step} ({armed.id})")
    for fired in state.fired:
        print(f"fired    {fired.fault} at step {fired.step} on rank {fired.rank} -> {fired.target}")
    for refused in state.rejected:
        print(f"refused  {refused.id}: {refused.reason}")
    return 0


def _faults(args: argparse.Namespace) -> int:
    if args.json:
        emit_json(faults_document())
        return 0
    common = [name for name in FaultSpec.model_fields if name != "kind"]
    print("Every fault takes: " + ", ".join(common))
    print("  (when: at_step/every/probability/after_seconds for duration steps; where: ranks)")
    by_class: dict[str, list[FaultKind]] = {}
    for kind in kinds().values():
        by_class.setdefault(kind.spec.fault_class, []).append(kind)
    for fault_class in FAULT_CLASSES:
        print(f"\n{fault_class}")
        for kind in sorted(by_class.get(fault_class, []), key=lambda k: k.name):
            print(f"  {kind.name:<24} {kind.spec.description}")
            own = [
                f"{name}={_default(field.default)}"
                for name, field in kind.spec.model_fields.items()
                if name not in FaultSpec.model_fields
            ]
            if own:
                print(f"  {'':<24} {' '.join(own)}")
            if kind.spec.triggers != TRIGGERS:
                print(f"  {'':<24} when: {' or '.join(kind.spec.triggers)} only")
    return 0


def _default(value: object) -> str:
    if value is PydanticUndefined:
        return "(required)"
    return repr(value) if isinstance(value, str) else str(value)


def _summary(args: argparse.Namespace) -> int:
    journal = read_journal(args.run_dir, warn=False)
    for note in journal.skipped:
        print(f"tightrope: warning: {note}", file=sys.stderr)
    result = summarize(journal)
    if args.json:
        emit_json(summary_document(result, args.run_dir, journal.skipped))
        return 0
    target = f"/{result.target_steps}" if result.target_steps else ""
    print(f"verdict: {result.verdict()}")
    print(f"run        {args.run_dir}")
    status = result.status or "no run_end (killed or still running)"
    print(f"status     {status} at step {result.end_step}{target}")
    print(f"ranks      {result.ranks}   restarts {result.restarts}")
    if result.restarts:
        print(
            f"attempts   {result.attempts}, highest step {result.steps}, "
            f"{result.steps_redone} steps redone"
        )
    print(f"checkpts   {result.checkpoints_saved} saved, {result.checkpoints_loaded} loaded")
    if result.median_step_time is not None:
        tps = result.tokens_per_second
        speed = f", {tps:,.0f} tokens/s" if tps is not None else ""
        print(f"speed      {result.median_step_time * 1e3:.1f} ms/step (median){speed}")
    if result.loss_by_step:
        print("loss       " + "  ".join(f"{s}: {v:.3f}" for s, v in result.loss_milestones()))
        print(f"           {result.loss_change()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tightrope`` console script; returns the exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # inject's NAME=VALUE parameters may come after its options.
    if getattr(args, "command", None) == "inject":
        params = [e for e in extra if "=" in e and not e.startswith("-")]
        args.params += params
        extra = [e for e in extra if e not in params]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.error("a command is required (tightrope --help lists them)")
    try:
        code: int = args.handler(args)
    except TightropeError as exc:
        print(f"tightrope: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`tightrope faults | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code


if __name__ == "__main__":
    sys.exit(main())
