"""Which rank the others wait for in a collective, from the collective ledger's files
alone (`reference_trainer.processes.collective_ledger` writes them): every rank of the
attempt whose count of all-reduces entered is below the highest.

Read by the hang monitor (a process of its own, which need not import torch) and by a
rank whose collective failed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness.run_layout import RunLayout


def counts(run_dir: Path, world_size: int, restart: int) -> dict[int, int]:
    """Each rank's count of all-reduces entered in attempt ``restart`` (ranks without a
    file for it are left out)."""
    found: dict[int, int] = {}
    for rank in range(world_size):
        try:
            record = json.loads(RunLayout(run_dir).collective_file(rank).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("restart") == restart:
            seq = record.get("seq")
            if isinstance(seq, int):
                found[rank] = seq
    return found


def culprits(seqs: dict[int, int], world_size: int) -> list[int]:
    """The ranks the others wait for: every rank below the highest count, when every rank
    has one (a rank with none could be one that never started); none when all agree."""
    if len(seqs) < world_size or not seqs:
        return []
    top = max(seqs.values())
    return sorted(r for r, seq in seqs.items() if seq < top)


def wait_for_culprits(
    run_dir: Path, world_size: int, restart: int, *, timeout: float, poll: float = 0.05
) -> tuple[list[int], dict[int, int]]:
    """`culprits` from the files, looked at until some are found or ``timeout`` seconds
    pass (a rank that failed before its peers reached the collective waits for them)."""
    end = time.monotonic() + timeout
    while True:
        seqs = counts(run_dir, world_size, restart)
        found = culprits(seqs, world_size)
        if found or time.monotonic() >= end:
            return found, seqs
        time.sleep(poll)
