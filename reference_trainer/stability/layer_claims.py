"""What a step's per-layer evidence adds to the journal and to the recovery policy: the
diagnosis of the problem layer when a detector fired, the `layer_stats` observations, and
a layer whose weights changed outside the optimizer as a failure to roll back from."""

from __future__ import annotations

from typing import Protocol

from harness.inside.agent import Agent
from harness.records.events import Claim, Detected, Diagnosed, LayerStatsObserved
from reference_trainer.stability.layer_diagnosis import Diagnosis, DiagnosisReport
from reference_trainer.stability.layer_monitor import LayerMonitor
from reference_trainer.stability.layer_stats import StepStats
from reference_trainer.stability.recovery import Failure


class StepOutcome(Protocol):
    """What a step did, as far as the layers' journal needs it (`step.StepResult`)."""

    @property
    def layers(self) -> StepStats | None:
        """The step's per-layer statistics (None when nothing measured them)."""
        ...

    @property
    def claims(self) -> list[Claim]:
        """What the step's mechanisms claimed."""
        ...

    @property
    def skipped(self) -> bool:
        """The update was skipped."""
        ...


#: Detectors whose firing is not about the numbers of a step: no layer to diagnose.
NOT_DIAGNOSED = frozenset({"dedup", "loss_scale_hysteresis", "loss_scale_backoff"})


def weights_changed(step: int, claims: list[Claim]) -> Failure | None:
    """A layer's weights swung outside the optimizer (a flipped bit): a failure, so that
    the recovery policy rolls back to weights that were not corrupted."""
    for claim in claims:
        if (
            isinstance(claim, Detected)
            and claim.detector == "layer_swing"
            and claim.details.get("signal") == "weight_norm"
        ):
            return Failure(step, "weights_changed", claim.details)
    return None


def journal_layers(
    agent: Agent,
    monitor: LayerMonitor,
    report: DiagnosisReport | None,
    result: StepOutcome,
    *,
    also_fired: list[str],
    enabled: bool,
) -> None:
    """When a detector fired, name the problem layer (a `diagnosed` claim and a line of
    diagnosis.md); journal the per-layer statistics every few steps and at every
    detection; a good step's statistics become the history the next ones are judged by."""
    stats = result.layers
    if stats is None:
        return
    detections = [c for c in result.claims if isinstance(c, Detected)]
    fired = [c.detector for c in detections if c.detector not in NOT_DIAGNOSED]
    fired = list(dict.fromkeys([*fired, *also_fired]))
    if fired and enabled:
        stalls = [c.details for c in detections if c.detector == "stalled_layer"]
        if stalls:
            layers = [str(s["layer"]) for s in stalls]
            diagnosis = Diagnosis(stats.step, fired, layers, "stalled", stalls)
        else:
            diagnosis = monitor.diagnose(stats, fired)
        agent.claim(
            Diagnosed(
                detectors=diagnosis.detectors,
                layers=diagnosis.layers,
                rule=diagnosis.rule,
                details={"evidence": diagnosis.evidence},
            )
        )
        if report is not None:
            report.add(diagnosis)
    if enabled and (fired or monitor.due(stats.step)):
        agent.observe_layers(LayerStatsObserved(layers=stats.to_json(), anomaly=bool(fired)))
    monitor.settle(stats, good=not fired and not result.skipped)
