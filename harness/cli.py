"""The ``tightrope`` command."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from pydantic_core import PydanticUndefined

from faults import FaultSpec, kinds
from faults.registry import FaultKind
from harness import __version__
from harness.errors import TightropeError
from harness.journal import read_journal
from harness.summary import summarize


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
    summary.set_defaults(handler=_summary)
    listing = commands.add_parser("faults", help="list every fault kind with its parameters")
    listing.set_defaults(handler=_faults)
    return parser


def _faults(args: argparse.Namespace) -> int:
    common = [name for name in FaultSpec.model_fields if name != "kind"]
    print("Every fault takes: " + ", ".join(common))
    print("  (when: at_step/every/probability/after_seconds for duration steps; where: ranks)")
    by_class: dict[str, list[FaultKind]] = {}
    for kind in kinds().values():
        by_class.setdefault(kind.spec.fault_class, []).append(kind)
    for fault_class in ("numeric", "checkpoint", "process", "data"):
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
    return 0


def _default(value: object) -> str:
    if value is PydanticUndefined:
        return "(required)"
    return repr(value) if isinstance(value, str) else str(value)


def _summary(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = summarize(read_journal(args.run_dir))
    for w in caught:
        print(f"tightrope: warning: {w.message}", file=sys.stderr)
    target = f"/{result.target_steps}" if result.target_steps else ""
    print(f"run        {args.run_dir}")
    print(f"status     {result.status} at step {result.steps}{target}")
    print(f"ranks      {result.ranks}   restarts {result.restarts}")
    print(f"checkpts   {result.checkpoints_saved} saved, {result.checkpoints_loaded} loaded")
    if result.median_step_time is not None:
        tps = result.tokens_per_second or 0.0
        print(
            f"speed      {result.median_step_time * 1e3:.1f} ms/step (median), {tps:,.0f} tokens/s"
        )
    if result.loss_by_step:
        print("loss       " + "  ".join(f"{s}: {v:.3f}" for s, v in result.loss_milestones()))
        first, last = result.loss_by_step[0][1], result.loss_by_step[-1][1]
        print(f"           {last / first:.2f} of the first step's loss at the last step")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tightrope`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        code: int = args.handler(args)
    except TightropeError as exc:
        print(f"tightrope: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
