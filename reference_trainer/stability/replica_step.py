"""The replica check between steps: on check steps and before every save, the ranks compare
a fingerprint of their parameters (`compare_replicas`); a mismatch is journaled and is a
failure that recovery answers by restoring the last checkpoint on every rank."""

from __future__ import annotations

from torch import nn

from harness.records.events import Detected
from reference_trainer.processes.distributed import Topology
from reference_trainer.stability.mechanism import Boundary, BuildContext, Mechanism
from reference_trainer.stability.recovery import Failure
from reference_trainer.stability.replicas import ReplicaCheckConfig, compare_replicas


class ReplicaCheck(Mechanism):
    """Compares the ranks' parameters between steps."""

    name = "replica_check"

    def __init__(self, cfg: ReplicaCheckConfig, model: nn.Module, topo: Topology) -> None:
        self.cfg, self.model, self.topo = cfg, model, topo

    @classmethod
    def build(cls, ctx: BuildContext) -> ReplicaCheck | None:
        """Built when the check is on."""
        cfg = ctx.stability.replica_check
        return cls(cfg, ctx.model, ctx.topo) if cfg.enabled else None

    def between_steps(self, b: Boundary) -> Failure | None:
        """On check steps and before every save: do the ranks hold the same parameters?"""
        if not (b.step % self.cfg.every == 0 or b.save_due):
            return None
        divergence = compare_replicas(self.model, self.topo)
        if divergence is None:
            return None
        details = {
            "differing_ranks": divergence.ranks,
            "fingerprints": {str(r): fp for r, fp in divergence.fingerprints.items()},
        }
        b.claims.append(Detected(detector="replica_divergence", details=details))
        return Failure(b.step, "replicas_diverged", details)
