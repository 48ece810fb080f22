"""Straggler detection in the step: each rank's compute time rides the step's one
all-reduce (a slice as wide as the job, the rank's own time in its place), every rank
scores them alike (`reference_trainer.stability.stragglers`), and rank 0 journals a flagged
rank (``detected: straggler`` and ``rank_blamed``) and alerts on its standard error.
By default journaling and alerting is the whole response: the run goes on at the pace of
its slowest rank, as it would unwatched, and the journal says which rank that is. With
``rebalance`` (``--enable straggler_rebalance``) a flagged rank also gets a smaller share
of each micro-step's sequences, the others the rest (`straggler_shares`), journaled by
rank 0 as ``recovered: straggler_rebalanced``; while shares are uneven, compute times are
compared per sequence.

The compute time is the time from the step's start to the agreement, less the time this
rank spent in all-reduces meanwhile (the collective ledger's count,
`reference_trainer.processes.collective_ledger`; without a ledger, nothing is taken off).
"""

from __future__ import annotations

import sys
import time

import torch

from harness.records.events import Detected, RankBlamed, Recovered
from reference_trainer.processes import collective_ledger
from reference_trainer.stability.mechanism import Boundary, BuildContext, Mechanism, StepState
from reference_trainer.stability.recovery import Failure
from reference_trainer.stability.straggler_shares import rebalanced
from reference_trainer.stability.stragglers import StragglerConfig, StragglerScores
from reference_trainer.stream.data import ShardedLoader


class StragglerWatch(Mechanism):
    """Scores every rank at every step; flags the one the others wait for."""

    name = "stragglers"

    def __init__(
        self,
        cfg: StragglerConfig,
        rank: int,
        world_size: int,
        loader: ShardedLoader | None = None,
    ) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.scores = StragglerScores(cfg, world_size)
        self._started = 0.0
        #: Steps up to this one are not scored (a checkpoint save is being written).
        self._quiet_until = 0
        #: Whose shares it sets when it rebalances (None: it never does).
        self.loader = loader if cfg.rebalance else None
        self._slow: set[int] = set()

    @classmethod
    def build(cls, ctx: BuildContext) -> StragglerWatch | None:
        """Built when on, in a job of two ranks or more (rebalancing fixed windows only:
        dynamic batches are cut by tokens, not sequences)."""
        cfg = ctx.stability.stragglers
        if not cfg.enabled or ctx.topo.world_size < 2:
            return None
        loader = ctx.loader if isinstance(ctx.loader, ShardedLoader) else None
        return cls(cfg, ctx.topo.rank, ctx.topo.world_size, loader)

    def begin_step(self, s: StepState) -> None:
        """Start the step's clock; forget collective time from before it."""
        self._started = time.perf_counter()
        ledger = collective_ledger.active()
        if ledger is not None:
            ledger.take_seconds()

    def local_slice(self, s: StepState) -> list[float]:
        """This rank's compute time so far, in its place."""
        elapsed = time.perf_counter() - self._started
        ledger = collective_ledger.active()
        waited = ledger.take_seconds() if ledger is not None else 0.0
        values = [0.0] * self.world_size
        values[self.rank] = max(elapsed - waited, 0.0)
        if self.loader is not None:  # per sequence, in units of an even share
            values[self.rank] /= self.loader.loss_weight()
        return values

    def agreed(self, s: StepState, values: torch.Tensor) -> None:
        """Score every rank; rank 0 journals and alerts a flagged one."""
        if s.step <= self._quiet_until:
            return
        for flag in self.scores.observe(s.step, [float(v) for v in values]):
            if self.rank != 0:
                continue
            reason = flag.reason(self.cfg)
            details = {
                "rank": flag.rank,
                "score": round(flag.score, 4),
                "since_step": flag.since,
                "median_compute_ms": [round(m * 1000.0, 3) for m in flag.medians],
                "threshold": self.cfg.threshold,
            }
            s.claims.append(Detected(detector="straggler", details=details))
            s.claims.append(RankBlamed(blamed_rank=flag.rank, detector="straggler", reason=reason))
            print(f"[tightrope] straggler: rank {flag.rank}: {reason}", file=sys.stderr)
        if self.loader is not None:
            self._rebalance(s, self.loader)

    def _rebalance(self, s: StepState, loader: ShardedLoader) -> None:
        """New shares, from the next step, when the set of flagged ranks changed (every
        rank alike; rank 0 journals them)."""
        slow = self.scores.flagged()
        if slow == self._slow:
            return
        self._slow = slow
        loader.shares = rebalanced(loader.batch_size, self.scores.scores, slow)
        if self.rank == 0:
            details = {
                "slow_ranks": sorted(slow),
                "scores": [round(score, 4) for score in self.scores.scores],
                "shares": loader.shares or [loader.batch_size] * self.world_size,
                "global_batch_kept": True,
            }
            s.claims.append(Recovered(action="straggler_rebalanced", details=details))

    def between_steps(self, b: Boundary) -> Failure | None:
        """A save is due after this step: the next steps are not scored."""
        if b.save_due:
            self._quiet_until = b.step + self.cfg.after_save
        return None
