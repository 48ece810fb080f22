"""Out of memory, retried: a rank whose step meets a failed allocation redoes the step with
its micro-batch halved and its gradient accumulation doubled, so the global batch (and so
the update) stays what it was, as Hugging Face Accelerate's ``find_executable_batch_size``
and DeepSpeed's elastic micro-batches do.

Each micro-batch's loss is divided by the number of micro-batches, so ``2k`` halves of
``B/2`` sequences give the same mean loss, and the same gradient up to rounding, as ``k``
micro-batches of ``B``. The split is this rank's alone (its memory is what failed) and
kept for the rest of the process: a memory limit does not go away after one step. The
other ranks are not told: under DDP only the last micro-batch's backward communicates,
and it still comes once per step on every rank.

A step can be redone while nothing of it has left the rank: the failure came in a forward
pass, or in the backward pass of a micro-batch under ``no_sync``. Once the last
micro-batch's backward has begun, DDP has started its all-reduces and the error goes on
to the crash report (a restart, with the cause named), as it does when the micro-batch
cannot be halved (one sequence, or ``max_halvings`` reached) or the mechanism is off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.records.events import Claim, Detected, RankBlamed, Recovered

#: What an allocation failure raises: CUDA's caching allocator, or Python (the CPU).
OOM_ERRORS: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)


@dataclass(kw_only=True, slots=True)
class OomRetryConfig:
    """How a step that ran out of memory is retried."""

    enabled: bool = True
    """Redo the step with the micro-batch halved (accumulation doubled) on an OOM."""
    max_halvings: int = 3
    """Halvings a rank may make in a run (8 sequences: 4, 2, 1)."""

    def __post_init__(self) -> None:
        value = self.max_halvings
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"stability.oom_retry.max_halvings must be an int >= 1, got {value!r}")


@dataclass(slots=True)
class MicroBatchSplit:
    """How many pieces each configured micro-batch is cut into on this rank."""

    cfg: OomRetryConfig
    rank: int
    #: Pieces per configured micro-batch (1: as configured; doubles at each halving).
    pieces: int = 1
    #: The claims of the halvings not yet handed to the step.
    claims: list[Claim] = field(default_factory=list)

    def split(self, batch: torch.Tensor) -> torch.Tensor:
        """A (micro-steps, B, T + 1) batch as (micro-steps * pieces, B / pieces, T + 1)."""
        if self.pieces == 1:
            return batch
        steps, size, width = batch.shape
        return batch.reshape(steps * self.pieces, size // self.pieces, width)

    def halve(self, error: BaseException, batch: torch.Tensor, step: int) -> bool:
        """After ``error`` in a step over ``batch`` (as configured): True when the step can
        be redone with the micro-batch halved (the claims are queued); False when not."""
        halvings = self.pieces.bit_length() - 1
        steps, size, _ = batch.shape
        micro = size // self.pieces
        if halvings >= self.cfg.max_halvings or micro % 2:
            return False
        self.pieces *= 2
        message = (str(error).strip().splitlines() or [""])[0][:300]
        details = {
            "rank": self.rank,
            "cause": type(error).__name__,
            "message": message,
            "micro_batch": [micro, micro // 2],
            "grad_accum": [steps * self.pieces // 2, steps * self.pieces],
            "global_batch_kept": True,
        }
        reason = (
            f"rank {self.rank} ran out of memory at step {step} ({type(error).__name__}); "
            f"the step was redone with micro-batches of {micro // 2} sequences, not {micro}"
        )
        self.claims += [
            Detected(detector="out_of_memory", details=details),
            RankBlamed(blamed_rank=self.rank, detector="out_of_memory", reason=reason),
            Recovered(action="micro_batch_halved", details=details),
        ]
        return True

    def take_claims(self) -> list[Claim]:
        """The halvings' claims since the last call."""
        claims, self.claims = self.claims, []
        return claims
