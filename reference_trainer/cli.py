"""Command line of the reference trainer: parse, settle the configuration, train.

Bad input (an unknown preset, a non-positive count, ``--resume`` of a folder holding
something else than a run, an unreadable checkpoint, a run dir another trainer owns) ends with one line on stderr and
exit code 2, before anything on disk is touched. A start-up killed before its first step
left no run (even one killed before it made its run dir): ``--resume`` and a fresh start
both start it over, saying so on stderr. A
failure once training had started (a checkpoint that cannot be written, named in words:
disk full, file too large) is one line and exit code 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from faults import FaultPlan
from faults.spec import MAX_STEP
from harness.errors import TightropeError
from harness.mechanisms import OPT_IN, TRAINER_MECHANISMS
from harness.optimizers import OPTIMIZERS
from harness.running.run_lock import RunDirLock
from harness.suites.scenario import MAX_BATCH_SIZE
from reference_trainer.checkpoints.files import checkpoint_step, complete_checkpoints
from reference_trainer.checkpoints.run_dir import (
    check_fresh,
    check_resumable,
    check_run,
    holds_no_run,
    unfinished_start,
)
from reference_trainer.checkpoints.schedule import token_count
from reference_trainer.config import PRECISIONS, PRESETS, TrainConfig, preset
from reference_trainer.corpus.mixes import DATA_MIXES, mix_weights
from reference_trainer.errors import ConfigError, TrainingFailed
from reference_trainer.processes.preemption import EXIT_PREEMPTED
from reference_trainer.stability.registry import disable, fragile

if TYPE_CHECKING:
    from reference_trainer.train import RunResult

PROG = "reference_trainer"
T = TypeVar("T", int, float)
#: Flags a resumed run may change; every other flag must match the saved configuration.
_RESUMABLE_CHANGES = (
    "steps",
    "checkpoint_every",
    "checkpoint_every_tokens",
    "keep_checkpoints",
    "log_every",
)
_OVERRIDES = ("batch_size", "grad_accum", "precision", "seed", *_RESUMABLE_CHANGES)
#: How long a worker torchrun restarted waits for its predecessor's claim on the run dir.
_RESTART_WAIT_SECONDS = 30.0
#: Flags that set a field of the optimizer's configuration: flag dest -> ``optim`` field.
_OPTIM_OVERRIDES = {"optimizer": "name", "lr": "base_lr", "beta1": "beta1", "beta2": "beta2"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _checked(
    kind: Callable[[str], T], ok: Callable[[T], bool], expected: str
) -> Callable[[str], T]:
    """An argparse type: ``kind(text)``, refused unless ``ok``, naming what was expected."""

    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


_positive_int = _checked(int, lambda v: 0 < v <= MAX_STEP, f"a positive integer up to {MAX_STEP}")
_batch_count = _checked(
    int, lambda v: 0 < v <= MAX_BATCH_SIZE, f"a positive integer up to {MAX_BATCH_SIZE}"
)
_positive_float = _checked(float, lambda v: 0 < v < math.inf, "a positive number")
_beta = _checked(float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (shared with the docs and tests)."""
    p = _Parser(prog=PROG, description="Train tightrope's reference GPT.")
    p.add_argument("--run-dir", type=Path, required=True, help="where the run's files go")
    p.add_argument(
        "--preset",
        help=f"model and recipe: {', '.join(PRESETS)} (default: tiny; a resumed run keeps its own)",
    )
    p.add_argument("--steps", type=_positive_int, help="train until this step (default: preset's)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument(
        "--stop-after",
        type=_positive_int,
        metavar="STEP",
        help="stop with a checkpoint after this step, as if preempted (the schedule still "
        "spans --steps)",
    )
    p.add_argument("--precision", choices=PRECISIONS, help="fp32, bf16 or fp16 (default: fp32)")
    p.add_argument("--batch-size", type=_batch_count, help="sequences per rank per micro-step")
    p.add_argument("--grad-accum", type=_batch_count, help="micro-steps per optimizer step")
    p.add_argument("--seed", type=int, help="training seed (default: 0)")
    p.add_argument(
        "--optimizer",
        choices=sorted(OPTIMIZERS),
        help=f"the optimizer: {', '.join(OPTIMIZERS)} (default: adamw)",
    )
    p.add_argument(
        "--lr", type=_positive_float, help="peak learning rate at the reference batch size"
    )
    p.add_argument("--beta1", type=_beta, help="the optimizer's beta1, in [0, 1)")
    p.add_argument("--beta2", type=_beta, help="the optimizer's beta2, in [0, 1)")
    p.add_argument("--checkpoint-every", type=_positive_int, help="steps between checkpoints")
    p.add_argument(
        "--checkpoint-every-tokens",
        type=token_count,
        metavar="N",
        help="trained tokens between checkpoints, e.g. 2M or 500k (instead of "
        "--checkpoint-every; the save is at the first step at or after each multiple)",
    )
    p.add_argument("--keep-checkpoints", type=_positive_int, help="checkpoints kept on disk")
    p.add_argument("--log-every", type=_positive_int, help="steps between progress lines")
    p.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: auto"
    )
    p.add_argument(
        "--fragile",
        action="store_true",
        help="switch every stability mechanism off (the negative control)",
    )
    p.add_argument(
        "--disable",
        action="append",
        default=[],
        choices=sorted(TRAINER_MECHANISMS),
        metavar="MECHANISM",
        help=f"switch one mechanism off (repeatable): {', '.join(TRAINER_MECHANISMS)}",
    )
    p.add_argument(
        "--enable",
        action="append",
        default=[],
        choices=sorted(OPT_IN),
        metavar="MECHANISM",
        help=f"switch one opt-in mechanism on (repeatable): {', '.join(OPT_IN)}",
    )
    p.add_argument(
        "--data-mix",
        choices=sorted(DATA_MIXES),
        help=f"the corpus sources' shares, by name: {', '.join(DATA_MIXES)} (default: default)",
    )
    p.add_argument(
        "--fault-plan", type=Path, metavar="PLAN.yaml", help="inject the faults of this plan"
    )
    return p


def settle_config(args: argparse.Namespace) -> TrainConfig:
    """The configuration to run: a preset with flags applied, or the resumed run's own."""
    given = {name: getattr(args, name) for name in _OVERRIDES if getattr(args, name) is not None}
    optim = {
        field: getattr(args, flag)
        for flag, field in _OPTIM_OVERRIDES.items()
        if getattr(args, flag) is not None
    }
    if args.checkpoint_every is not None:
        if args.checkpoint_every_tokens is not None:
            raise ConfigError(
                "--checkpoint-every and --checkpoint-every-tokens are two schedules; give one"
            )
        given["checkpoint_every_tokens"] = 0  # steps it is, also for a resumed token run
    if not args.resume:
        cfg = preset(args.preset or "tiny")
        if args.fragile:
            cfg.stability = fragile()
        for name in args.disable:
            disable(cfg.stability, name)
        for name in args.enable:
            cfg.enable(name)
        if args.data_mix is not None:
            cfg.data.source_weights = mix_weights(args.data_mix)
        if optim:
            given["optim"] = {**dataclasses.asdict(cfg.optim), **optim}
        return _apply(cfg, given)
    if (args.fragile or args.disable or args.enable) and not restart_count():
        # (A restarted worker gets the first attempt's flags again; they are settled.)
        raise ConfigError(
            "--fragile, --disable and --enable apply to fresh runs; a resumed run keeps its own"
        )
    cfg = TrainConfig.load(args.run_dir)
    if args.data_mix is not None and mix_weights(args.data_mix) != cfg.data.source_weights:
        raise ConfigError(
            f"--data-mix {args.data_mix} differs from the resumed run's source weights "
            f"{cfg.data.source_weights}; a resumed run keeps its configuration"
        )
    if args.preset is not None and args.preset != cfg.preset:
        raise ConfigError(
            f"--preset {args.preset} differs from the resumed run's preset {cfg.preset}"
        )
    for flag, field in _OPTIM_OVERRIDES.items():
        value = optim.get(field)
        if value is not None and value != getattr(cfg.optim, field):
            raise ConfigError(
                f"--{flag} {value} differs from the resumed run's {getattr(cfg.optim, field)}; "
                "a resumed run keeps its configuration"
            )
    for name, value in given.items():
        if name not in _RESUMABLE_CHANGES and value != getattr(cfg, name):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag} {value} differs from the resumed run's {getattr(cfg, name)}; "
                "a resumed run keeps its configuration"
            )
    return _apply(cfg, given)


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _check_plan(plan: FaultPlan, path: Path, steps: int) -> None:
    """A plan that could not take effect in this run is refused, as a suite's would be."""
    if not len(plan):
        raise ConfigError(f"--fault-plan {path} holds no fault; leave the flag out for none")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    problems = plan.problems(steps, world_size)
    if problems:
        raise ConfigError(f"--fault-plan {path}: " + "; ".join(problems))


def _apply(cfg: TrainConfig, values: dict[str, object]) -> TrainConfig:
    data = cfg.to_dict()
    data.update(values)
    return TrainConfig.from_dict(data)


def restart_count() -> int:
    """How many times torchrun has restarted the workers (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code.

    A worker that torchrun restarted after a failure continues from the run's latest
    checkpoint (or starts over when the run saved none), whatever ``--resume`` says.
    """
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    if args.seed is not None and not 0 <= args.seed < 2**32:
        print(f"{PROG}: error: --seed {args.seed} is not within 0 to 2^32-1", file=sys.stderr)
        return 2
    if args.device == "cuda" and not _cuda_available():
        print(f"{PROG}: error: --device cuda, but this machine has no CUDA device", file=sys.stderr)
        return 2
    restarted = restart_count() > 0
    claim: RunDirLock | None = None
    try:
        claim = _claim(args, rank, restarted)
        result = _run(args, rank, restarted)
    except TightropeError as exc:
        who = PROG if rank == 0 else f"{PROG}[rank {rank}]"
        print(f"{who}: error: {exc}", file=sys.stderr)
        # Bad input is refused before anything on disk changed (2); a failure once training
        # had started is a failed run (1).
        failed = isinstance(exc, TrainingFailed)
        if claim is not None:
            claim.release(undo=not failed)
        return 1 if failed else 2
    finally:
        if claim is not None:
            claim.release()
    if result is None:
        return 0
    # Training that failed for good (recovery exhausted) is not bad input: exit 1. A
    # preempted run exits as a terminated process would, so that torchrun restarts it.
    if result.status == "preempted":
        return EXIT_PREEMPTED
    return 1 if result.status == "failed" else 0


def _claim(args: argparse.Namespace, rank: int, restarted: bool) -> RunDirLock | None:
    """Rank 0 owns the run dir for its life (`harness.running.run_lock`): another trainer
    on it is refused, naming it. The other ranks of the job write only once rank 0 has let
    them through its first barrier, so one holder serves the job; a worker torchrun
    restarted waits a while for its predecessor, which torchrun is still ending, to let go.
    Nothing is claimed where the checks below refuse to go (not a directory). A run dir
    that does not exist is made, also for ``--resume``: a job killed before its start made
    the dir resumes by starting the run (`holds_no_run`), as after any start-up killed
    before it wrote its configuration."""
    run_dir = args.run_dir
    if rank != 0 or not (run_dir.is_dir() or not run_dir.exists()):
        return None
    return RunDirLock.acquire(run_dir, wait=_RESTART_WAIT_SECONDS if restarted else 0.0)


def _run(args: argparse.Namespace, rank: int, restarted: bool) -> RunResult | None:
    """Settle the configuration against the run dir, then train; None: nothing to do."""
    why = unfinished_start(args.run_dir)
    if why is None and args.resume and holds_no_run(args.run_dir):
        why = "nothing of a run was written in it"
    elif why is None and not args.resume and not restarted:
        why = check_fresh(args.run_dir)
    if why is not None:
        if rank == 0:
            print(
                f"{PROG}: {args.run_dir}: its start-up never finished ({why}); starting the "
                f"run over{' (--resume has nothing to resume)' if args.resume else ''}",
                file=sys.stderr,
                flush=True,
            )
        args.resume = False
    if restarted and not args.resume and complete_checkpoints(args.run_dir):
        args.resume = True
    if args.resume:
        check_run(args.run_dir)
        cfg = settle_config(args)
        start = check_resumable(args.run_dir, integrity=cfg.stability.checkpoints.integrity)
        done = 0 if start is None else checkpoint_step(start)
        if start is None and rank == 0:
            print(
                f"{args.run_dir} never finished a checkpoint; starting over from step 0 "
                "with its configuration"
            )
        if done >= cfg.steps:
            if rank == 0:
                print(
                    f"{args.run_dir} is already at step {done}; "
                    f"nothing to do for --steps {cfg.steps}"
                )
            return None
        if args.stop_after is not None and args.stop_after <= done:
            raise ConfigError(
                f"--stop-after {args.stop_after} is not past the checkpoint's step {done}"
            )
    else:
        cfg = settle_config(args)
    from reference_trainer.train import train  # torch and friends load only past here

    if args.stop_after is not None and args.stop_after > cfg.steps:
        raise ConfigError(f"--stop-after {args.stop_after} is past --steps {cfg.steps}")
    plan = FaultPlan.from_yaml(args.fault_plan) if args.fault_plan else None
    if plan is not None:
        _check_plan(plan, args.fault_plan, cfg.steps)
    return train(
        cfg,
        args.run_dir,
        resume=args.resume,
        restarted=restarted,
        device=args.device,
        stop_after=args.stop_after,
        plan=plan,
    )
