"""A rank whose collective failed names the rank the others wait for: from the collective
ledger's files (`reference_trainer.processes.collective_counts`), the ranks that never
entered the all-reduce the others entered. The failing rank may be the culprit (its own
call raised before it reached the backend) or a bystander (a peer died under it); either
way the files say which, once the healthy ranks have reached the collective, so it looks
for up to ``timeout`` seconds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.records.events import Claim, Detected, RankBlamed
from reference_trainer.processes.collective_counts import wait_for_culprits

#: Words in an error that say a collective failed (torch's own errors and the backends').
COLLECTIVE_WORDS = (
    "DistBackendError",
    "DistNetworkError",
    "all_reduce",
    "allreduce",
    "gloo",
    "NCCL",
)


def collective_error(exc: BaseException) -> bool:
    """The exception (or one it came from) is a collective's failure."""
    seen: BaseException | None = exc
    while seen is not None:
        text = f"{type(seen).__name__}: {seen}"
        if any(word in text for word in COLLECTIVE_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def blame_failed_collective(
    exc: BaseException,
    run_dir: Path,
    *,
    world_size: int,
    restart: int,
    claim: Callable[[Claim], None],
    timeout: float,
) -> list[int]:
    """Claim ``collective_watchdog`` and ``rank_blamed`` for each rank that never entered
    the collective, when ``exc`` is a collective's failure; the ranks named."""
    if not collective_error(exc):
        return []
    blamed, seqs = wait_for_culprits(run_dir, world_size, restart, timeout=timeout)
    for rank in blamed:
        details = {
            "rank": rank,
            "collective_counts": {str(r): n for r, n in seqs.items()},
            "error": f"{type(exc).__name__}: {exc}"[:500],
        }
        claim(Detected(detector="collective_watchdog", details=details))
        reason = (
            f"entered {seqs[rank]} all-reduces, the others {max(seqs.values())}, "
            f"when a collective failed ({type(exc).__name__})"
        )
        claim(RankBlamed(blamed_rank=rank, detector="collective_watchdog", reason=reason))
    return blamed
