"""The flags that choose where runs execute, shared by ``run``, ``sweep`` and ``soak``:
``--executor local|ray``, ``--ray-address ADDR|auto`` and ``--run-root DIR`` (docs/cluster.md).
Ray is imported only with ``--executor ray``."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.errors import TightropeError
from harness.running.executor import Executor


class ExecutorUsageError(TightropeError):
    """A cluster flag given without ``--executor ray``."""


def add_executor_args(parser: Any) -> None:
    """Add the executor's flags to a command's parser."""
    parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where runs execute: this machine (default) or a Ray cluster, one task per run",
    )
    parser.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to use: HOST:PORT, ray://HOST:PORT or auto (default: auto)",
    )
    parser.add_argument(
        "--run-root",
        type=Path,
        metavar="DIR",
        help="a path every node and this machine share: runs are written there, not sent "
        "back through Ray's object store",
    )


@contextlib.contextmanager
def chosen_executor(args: argparse.Namespace) -> Iterator[Executor | None]:
    """The executor the flags ask for (None: local, within --cores), closed afterwards."""
    if args.executor != "ray":
        given = [
            f for f, v in (("--ray-address", args.ray_address), ("--run-root", args.run_root)) if v
        ]
        if given:
            raise ExecutorUsageError(f"{' and '.join(given)} go with --executor ray")
        yield None
        return
    from harness.running.ray_executor import RayExecutor

    executor = RayExecutor(args.ray_address or "auto", run_root=args.run_root)
    try:
        yield executor
    finally:
        executor.close()
