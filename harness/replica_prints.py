"""Which ranks' parameter fingerprints differ from the others: one rule that the reference
trainer's `replica_check` (which restores a checkpoint) and the `replicas_consistent` oracle
(which judges the journal) both follow."""

from __future__ import annotations

from collections import Counter


def odd_ranks(fingerprints: dict[int, str]) -> list[int]:
    """The ranks that differ from the others: those not holding the most common fingerprint,
    or every rank when two fingerprints are equally common (two ranks that disagree)."""
    counts = Counter(fingerprints.values()).most_common()
    if len(counts) == 1:
        return []
    (top, held), (_, second) = counts[0], counts[1]
    if held == second:
        return sorted(fingerprints)
    return sorted(rank for rank, fp in fingerprints.items() if fp != top)
