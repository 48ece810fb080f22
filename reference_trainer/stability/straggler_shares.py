"""Rebalancing a straggler (opt-in, ``--enable straggler_rebalance``): a flagged rank gets a
smaller share of each micro-step's sequences and the others take the rest, so the global
batch is kept and the step waits less for the slow rank.

This is meaningful under DDP with the reference trainer's loader because every rank draws
the same global batch of windows from the stream and keeps a contiguous slice of it
(`reference_trainer.stream.data.ShardedLoader`): uneven slices still cover the global
batch exactly once. DDP averages the ranks' gradients with equal weights, so each rank
multiplies its mean loss by its share over an even share (``ShardedLoader.loss_weight``):
the average over ranks is then the mean over the global batch, as before (up to rounding).
A trainer whose ranks read disjoint files could not move sequences between ranks; its
alternative is the issue's other response, a restart without the rank.

Shares follow each rank's speed: the fastest rank's compute time per sequence over its
own, the straggler score (`reference_trainer.stability.stragglers`), measured per
sequence while shares are uneven so a rebalanced rank keeps its score (and stays
flagged) while it is slow, and gets an even share back when its score recovers. Every
rank computes the same shares from the same agreed times, so no extra message is needed.
"""

from __future__ import annotations

from collections.abc import Sequence


def shares(total: int, speeds: Sequence[float]) -> list[int]:
    """Sequences per micro-step for each rank, in proportion to its speed (sequences per
    second, any unit), at least one each, summing to ``total`` (largest remainder, ties to
    the lower rank)."""
    n = len(speeds)
    if n == 0 or total < n:
        raise ValueError(f"cannot share {total} sequences among {n} ranks, at least 1 each")
    if any(not s > 0 for s in speeds):
        raise ValueError(f"speeds must be > 0, got {list(speeds)}")
    spare = total - n  # one each first
    whole = sum(speeds)
    exact = [spare * s / whole for s in speeds]
    out = [1 + int(e) for e in exact]
    left = total - sum(out)
    by_remainder = sorted(range(n), key=lambda r: (-(exact[r] - int(exact[r])), r))
    for rank in by_remainder[:left]:
        out[rank] += 1
    return out


def rebalanced(batch_size: int, scores: Sequence[float], slow: set[int]) -> list[int] | None:
    """The shares when the ``slow`` ranks go at their ``scores`` (the others at full
    speed); None when none is slow (even shares)."""
    if not slow:
        return None
    speeds = [scores[r] if r in slow else 1.0 for r in range(len(scores))]
    return shares(batch_size * len(scores), speeds)
