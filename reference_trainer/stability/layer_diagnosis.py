"""Naming the problem layer when a detector fires, from the step's per-layer statistics
against each layer's own history, and the `diagnosis.md` that collects the findings.

The rules, in order; the first that finds something decides (`Diagnosis.rule`):

1. ``weights``: layers whose weight norm is not finite or ``factor`` times off its median:
   their weights changed outside the optimizer (a flipped bit, a bad restore).
2. ``activation``: the first layer, in forward order, whose output is not finite or whose
   largest activation is ``factor`` times above its median (the layers after it only
   inherit it).
3. ``gradient_not_finite``: the layers with a non-finite gradient norm, when some layers'
   gradients are finite (when every layer's is, the cause came from the loss).
4. ``gradient_swing``: the layer whose gradient norm is furthest from its median, when
   that is at least ``factor`` times off.

Otherwise no layer stands out (a cause that reached every layer alike: the learning rate,
the data), and the diagnosis says so rather than guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference_trainer.stability.layer_stats import StepStats
from reference_trainer.stability.layer_watch import LayerHistory


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The layer(s) a firing detector points at, with the evidence."""

    step: int
    detectors: list[str]
    layers: list[str]
    rule: str
    evidence: list[dict[str, Any]] = field(default_factory=list)

    @property
    def details(self) -> dict[str, Any]:
        """The `diagnosed` event's details."""
        return {
            "detectors": self.detectors,
            "layers": self.layers,
            "rule": self.rule,
            "evidence": self.evidence,
        }


def _ratio(value: float | None, median: float | None) -> float | None:
    if value is None or median is None or median <= 0:
        return None
    return value / median if math.isfinite(value) else math.inf


def _off(ratio: float | None, factor: float) -> bool:
    return ratio is not None and (ratio >= factor or ratio * factor <= 1)


def _fact(layer: str, signal: str, value: float | None, median: float | None) -> dict[str, Any]:
    ratio = _ratio(value, median)
    finite = value is not None and math.isfinite(value)
    return {
        "layer": layer,
        "signal": signal,
        "value": value if finite else str(value),
        "median": median,
        "ratio": ratio if ratio is None or math.isfinite(ratio) else "inf",
    }


def diagnose(
    stats: StepStats,
    history: LayerHistory,
    detectors: list[str],
    *,
    order: list[str],
    factor: float,
) -> Diagnosis:
    """Name the layer(s) behind this step's detections (see the module's rules)."""
    layers = [name for name in order if name in stats.layers]

    def found(rule: str, facts: list[dict[str, Any]]) -> Diagnosis:
        named = list(dict.fromkeys(f["layer"] for f in facts))
        return Diagnosis(stats.step, detectors, named, rule, facts)

    def value(layer: str, signal: str) -> float | None:
        return stats.value(layer, signal)

    def median(layer: str, signal: str) -> float | None:
        return history.median(layer, signal)

    weights = [
        _fact(n, "weight_norm", value(n, "weight_norm"), median(n, "weight_norm"))
        for n in layers
        if value(n, "weight_norm") is not None
        and (
            not math.isfinite(value(n, "weight_norm") or 0.0)
            or _off(_ratio(value(n, "weight_norm"), median(n, "weight_norm")), factor)
        )
    ]
    if weights:
        weights.sort(key=lambda f: -_magnitude(f["ratio"]))
        return found("weights", weights)
    for n in layers:  # the first layer whose output is off; the ones after inherit it
        act, usual = value(n, "act_max"), median(n, "act_max")
        ratio = _ratio(act, usual)
        if act is not None and (not math.isfinite(act) or (ratio is not None and ratio >= factor)):
            return found("activation", [_fact(n, "act_max", act, usual)])
    grads = [n for n in layers if value(n, "grad_norm") is not None]
    bad = [n for n in grads if not math.isfinite(value(n, "grad_norm") or 0.0)]
    if bad and len(bad) < len(grads):
        facts = [_fact(n, "grad_norm", value(n, "grad_norm"), median(n, "grad_norm")) for n in bad]
        return found("gradient_not_finite", facts)
    swings = [
        _fact(n, "grad_norm", value(n, "grad_norm"), median(n, "grad_norm"))
        for n in grads
        if n not in bad and _off(_ratio(value(n, "grad_norm"), median(n, "grad_norm")), factor)
    ]
    if swings:
        swings.sort(key=lambda f: -_magnitude(f["ratio"]))
        return found("gradient_swing", swings[:1])
    return Diagnosis(stats.step, detectors, [], "none")


def _magnitude(ratio: Any) -> float:
    """Orders of magnitude a ratio is away from 1, either way."""
    if ratio == "inf":
        return math.inf
    if not isinstance(ratio, float) or ratio <= 0:
        return 0.0 if ratio is None else math.inf
    return abs(math.log10(ratio))


class DiagnosisReport:
    """`diagnosis.md` (rank 0): why recovery gave up, when it did, and every problem layer
    named along the way (the latest 50)."""

    KEEP = 50

    def __init__(self, path: Path) -> None:
        self.path = path
        self.recovery = ""
        self.diagnoses: list[Diagnosis] = []

    def gave_up(self, text: str) -> None:
        """Record the recovery policy's account and rewrite the file."""
        self.recovery = text
        self._write()

    def add(self, diagnosis: Diagnosis) -> None:
        """Record a problem layer and rewrite the file."""
        self.diagnoses = [*self.diagnoses, diagnosis][-self.KEEP :]
        self._write()

    def _write(self) -> None:
        parts = [self.recovery] if self.recovery else ["# Diagnosis", ""]
        if self.diagnoses:
            parts += [
                "## Problem layers",
                "",
                "Each time a detector fired, the layer its evidence points at "
                "(docs/stability.md, `layer_stats`).",
                "",
                "| step | detectors | layer(s) | rule | evidence |",
                "|---|---|---|---|---|",
            ]
            for d in self.diagnoses:
                named = ", ".join(d.layers) or "none stands out"
                facts = "; ".join(
                    f"{f.get('layer')}: "
                    + ", ".join(f"{k} {_show(v)}" for k, v in f.items() if k != "layer")
                    for f in d.evidence
                )
                parts.append(
                    f"| {d.step} | {', '.join(d.detectors)} | {named} | {d.rule} | {facts} |"
                )
            parts.append("")
        self.path.write_text("\n".join(parts) + "\n")


def _show(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
