"""Shared fixtures: small, fast configurations and helpers to run the trainer for real."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_module(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ...`` (or any args) with this interpreter, capturing output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def torchrun(
    nproc: int, *args: str, timeout: float = 300, max_restarts: int = 0
) -> subprocess.CompletedProcess[str]:
    """Launch ``torchrun --nproc-per-node N -m reference_trainer ARGS`` and wait for it."""
    return run_module(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        str(max_restarts),
        "-m",
        "reference_trainer",
        *args,
        timeout=timeout,
    )


@pytest.fixture
def quiet() -> contextlib.AbstractContextManager[object]:
    """Silence the trainer's progress lines in in-process runs."""
    return contextlib.redirect_stdout(io.StringIO())
