"""Quality-weighted sampling in the step (opt-in, docs/data.md): each micro-batch's
per-token losses are summed by source, the sums are agreed over ranks, and a good step
moves the corpus's sampling weights toward the sources the model learns from."""

from __future__ import annotations

from typing import Any

import torch

from reference_trainer.stability.mechanism import BuildContext, Mechanism, StepState
from reference_trainer.stability.quality_sampling import QualitySampler
from reference_trainer.stream.data import DocumentPipeline, ShardedLoader


class QualitySampling(Mechanism):
    """Drives a `QualitySampler` from the step's losses."""

    name = "quality_sampling"
    state_keys = ("quality",)

    def __init__(
        self, sampler: QualitySampler, documents: DocumentPipeline, loader: ShardedLoader
    ) -> None:
        self.sampler, self.documents, self.loader = sampler, documents, loader
        self.sources: torch.Tensor | None = None
        self.by_source: torch.Tensor | None = None

    @classmethod
    def build(cls, ctx: BuildContext) -> QualitySampling | None:
        """Built when switched on (never with dynamic batching: the config refuses it)."""
        cfg = ctx.stability.quality_sampling
        if not cfg.enabled:
            return None
        device = ctx.topo.device
        sampler = QualitySampler(cfg, ctx.source_weights, device, last_step=ctx.steps)
        return cls(sampler, ctx.documents, ctx.loader)

    def on_micro_batch(self, micro: int, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Add the micro-batch's per-token losses to their sources' sums."""
        if micro == 0:
            sources = self.loader.last_sources
            if sources is not None:  # cut as the batch was (smaller micro-batches after an OOM)
                sources = sources.reshape(-1, logits.shape[0], sources.shape[-1])
            self.sources = sources.to(logits.device) if sources is not None else None
        if self.sources is not None:
            self.sampler.observe(logits, targets, self.sources[micro, :, 1:])

    def local_slice(self, s: StepState) -> torch.Tensor:
        """This rank's per-source sums and counts."""
        return self.sampler.local_totals()

    def agreed(self, s: StepState, values: torch.Tensor) -> None:
        """The same, over every rank."""
        self.by_source = values

    def end_step(self, s: StepState) -> None:
        """New weights after a good step; the `data_weights` observation when due."""
        if self.by_source is not None:
            s.data = self.sampler.after_step(self.documents, self.by_source, s.step, skipped=s.skip)

    def state_dict(self) -> dict[str, Any]:
        """Scores and weights."""
        return {"quality": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Scores and weights, and the documents drawn by them from here on."""
        if state.get("quality"):
            self.sampler.load_state_dict(state["quality"])
            self.sampler.apply(self.documents)
