"""Which step a resumed process is at, from evidence rather than position.

A process that loaded a save before training resumes after the step of that save, unless
its first batch says otherwise: the trainer may train again steps it had trained before
its save (a snapshot written after epoch ``e`` that says ``epochs_run = e`` replays epoch
``e``). Every step journals a fingerprint of its batch; the resumed process's first batch
is looked up among the earlier attempts' steps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.inside.step_evidence import local
from harness.records.events import StepObserved
from harness.records.journal import read_journal_file
from harness.run_layout import RunLayout

#: Elements of a batch that its fingerprint hashes (with its dtype and shape).
ELEMENTS = 4096


def batch_fingerprint(batch: torch.Tensor) -> str:
    """16 hex digits of ``batch``'s dtype, shape and first `ELEMENTS` elements."""
    h = hashlib.blake2b(f"{batch.dtype}{tuple(batch.shape)}".encode(), digest_size=8)
    plain = type(batch) is torch.Tensor and batch.device.type == "cpu"
    if plain and batch.dtype in _AS_NUMPY and not batch.requires_grad and batch.is_contiguous():
        # The common case, token ids in memory: their bytes as they are, with no torch call
        # (each costs on a short step).
        h.update(batch.numpy().reshape(-1)[:ELEMENTS].tobytes())
        return h.hexdigest()
    with torch.no_grad():
        flat = local(batch.detach()).reshape(-1)[:ELEMENTS].contiguous()
        h.update(flat.cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


#: Dtypes whose tensors `batch_fingerprint` reads through numpy as they are.
_AS_NUMPY = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32)


def earlier_batches(run_dir: Path, restart: int) -> dict[str, list[int]]:
    """Fingerprint -> steps that trained on that batch, in the attempts before ``restart``
    (every rank)."""
    folder = RunLayout(run_dir).journal
    found: dict[str, list[int]] = {}
    for path in sorted(folder.glob("rank-*.jsonl")) if folder.is_dir() else []:
        for event in read_journal_file(path, warn=False):
            fingerprint = event.get("batch_fingerprint")
            if event.is_(StepObserved) and event.restart < restart and isinstance(fingerprint, str):
                found.setdefault(fingerprint, []).append(event.step)
    return found


@dataclass(frozen=True, slots=True)
class Numbering:
    """Where a resumed process starts counting, and on what evidence."""

    done: int
    """Steps done before the process's first step."""
    numbered_by: str
    conflict: dict[str, int] | None = None

    def fields(self) -> dict[str, Any]:
        """The first step event's fields that say so."""
        extra: dict[str, Any] = {"numbered_by": self.numbered_by}
        if self.conflict is not None:
            extra["step_conflict"] = self.conflict
        return extra


def number(saved_step: int, steps: list[int]) -> Numbering:
    """The numbering of a process that loaded the save of ``saved_step`` and whose first
    batch was trained at ``steps`` before.

    The save's next step, when the batch was trained there too; else the latest step at or
    before it that trained on the batch (the trainer replays steps); a batch only ever
    trained after the save's next step contradicts the save: counted from the save, with
    the conflict said.
    """
    if not steps:
        return Numbering(saved_step, "save")
    if saved_step + 1 in steps:
        return Numbering(saved_step, "batch")
    before = [s for s in steps if s <= saved_step + 1]
    if before:
        return Numbering(max(before) - 1, "batch")
    return Numbering(saved_step, "save", {"batch_step": min(steps), "saved_step": saved_step})
