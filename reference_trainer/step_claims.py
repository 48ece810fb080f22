"""The claims of a step's data path: documents the data stages dropped (the stability
mechanisms' own claims come from their hooks, `reference_trainer.stability.mechanism`)."""

from __future__ import annotations

from harness.records.events import Claim, Detected
from reference_trainer.stream.data import DataCounters


def data_claims(counters: DataCounters) -> list[Claim]:
    """Documents each stage dropped this step, by source: one detection per stage."""
    claims: list[Claim] = []
    for stage, by_source in counters.dropped.items():
        claims.append(
            Detected(
                detector=stage,
                details={
                    "dropped": sum(sum(r.values()) for r in by_source.values()),
                    "by_source": by_source,
                    "contaminated_dropped": counters.contaminated_dropped.get(stage, 0),
                },
            )
        )
    return claims
