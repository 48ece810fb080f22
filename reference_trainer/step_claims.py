"""The claims a step's mechanisms give rise to, from what each of them reports: a loss-scale
change, blocks switched between precisions, documents the data stages dropped."""

from __future__ import annotations

from harness.records.events import Claim, Detected, Recovered
from reference_trainer.stability.loss_scale import ScaleChange
from reference_trainer.stability.precision_switch import Switch
from reference_trainer.stream.data import DataCounters


def scale_claims(change: ScaleChange | None) -> list[Claim]:
    """A growth or a raise is a recovery; a backoff or a hysteresis tick, a detection."""
    if change is None:
        return []
    name = "loss_scale_" + change.action
    details = {"old": change.old, "new": change.new, "hysteresis_left": change.hysteresis_left}
    if change.action in ("growth", "raised"):
        return [Recovered(action=name, details=details)]
    return [Detected(detector=name, details=details)]


def switch_claims(switches: list[Switch]) -> list[Claim]:
    """A block moved to fp32 was detected near the fp16 limit; every move is a recovery."""
    claims: list[Claim] = []
    for switch in switches:
        details = {"layer": switch.layer, "max_abs": switch.max_abs}
        if switch.to == "fp32":
            claims.append(Detected(detector="activation_range", details=dict(details)))
        claims.append(Recovered(action=f"precision_{switch.to}", details=details))
    return claims


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
