"""Quality-weighted sampling (opt-in `quality_sampling`): the per-source loss of each
step, measured from the logits the step already computed, moves a quality score per source
and the corpus's sampling weights follow it within bounds (the rule: `quality_weights`).

Each step: `observe` adds every micro-batch's per-token losses to per-source sums (the
source of each target token comes from the stream, `TokenStream` with ``tag_sources``);
`local_totals` hands the sums to the step's one collective; `end_step` takes the sums over
all ranks and, on a good step only, updates the scores and the weights. The weights
change at step boundaries only, and every rank computes them from the same reduced
numbers, so every rank reads the same documents. Scores and weights are in the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from harness.records.events import DataWeightsObserved
from reference_trainer.corpus.corpus import SOURCE_NAMES
from reference_trainer.stability.quality_weights import (
    QualitySamplingConfig,
    bounded_weights,
    relative_quality,
    updated_quality,
)
from reference_trainer.stream.data import DocumentPipeline


class QualitySampler:
    """Per-source loss in, the corpus's sampling weights out."""

    def __init__(
        self,
        cfg: QualitySamplingConfig,
        base: Mapping[str, float],
        device: torch.device,
        *,
        last_step: int = 0,
    ) -> None:
        self.cfg = cfg
        #: The run's last step, journaled whatever `journal_every` says.
        self.last_step = last_step
        total = sum(base.values())
        self.base = [float(base.get(s, 0.0)) / total for s in SOURCE_NAMES]
        self.quality = [1.0] * len(SOURCE_NAMES)
        self.weights = list(self.base)
        #: The last step's per-source mean loss (None: too few tokens, or a skipped step).
        self.losses: list[float | None] = [None] * len(SOURCE_NAMES)
        self.tokens = [0] * len(SOURCE_NAMES)
        self._ids = torch.arange(len(SOURCE_NAMES), device=device)
        self._sums = torch.zeros(len(SOURCE_NAMES), device=device)
        self._counts = torch.zeros(len(SOURCE_NAMES), device=device)

    def observe(self, logits: torch.Tensor, targets: torch.Tensor, sources: torch.Tensor) -> None:
        """Add one micro-batch's per-token losses to its sources' sums (``sources`` holds
        each target token's source id, -1 where unknown)."""
        with torch.no_grad():
            per_token = F.cross_entropy(
                logits.detach().float().view(-1, logits.size(-1)),
                targets.reshape(-1),
                reduction="none",
            )
            # A (tokens, sources) mask and sums over its rows, not index_add_: sums are
            # deterministic on CUDA, atomic adds are not (and the weights must be exact).
            mask = (sources.reshape(-1, 1) == self._ids).float()
            self._sums += (per_token.unsqueeze(1) * mask).sum(0)
            self._counts += mask.sum(0)

    def local_totals(self) -> torch.Tensor:
        """This rank's per-source loss sums and token counts of the step, then reset."""
        out = torch.cat([self._sums, self._counts])
        self._sums.zero_()
        self._counts.zero_()
        return out

    def end_step(self, totals: torch.Tensor, *, good: bool) -> bool:
        """Update scores and weights from the sums over all ranks (on a good step only);
        True when the weights changed."""
        n = len(SOURCE_NAMES)
        values = [float(v) for v in totals.tolist()]
        sums, counts = values[:n], values[n:]
        self.tokens = [round(c) for c in counts]
        self.losses = [
            s / c if good and c >= self.cfg.min_tokens else None
            for s, c in zip(sums, counts, strict=True)
        ]
        if not good:
            return False
        relative = relative_quality(sums, counts, self.cfg.min_tokens)
        self.quality = updated_quality(self.quality, relative, self.cfg.ema)
        factors = [q**self.cfg.power for q in self.quality]
        weights = bounded_weights(self.base, factors, self.cfg.min_factor, self.cfg.max_factor)
        changed = weights != self.weights
        self.weights = weights
        return changed

    def after_step(
        self, documents: DocumentPipeline, totals: torch.Tensor, step: int, *, skipped: bool
    ) -> DataWeightsObserved | None:
        """`end_step`, then the documents of the next steps drawn by the new weights; the
        `data_weights` observation when one is due."""
        if self.end_step(totals, good=not skipped):
            self.apply(documents)
        return self.event(step, last=step == self.last_step)

    def apply(self, documents: DocumentPipeline) -> None:
        """Draw the pipeline's next documents by the current weights (same position)."""
        documents.use_corpus(documents.corpus.reweighted(self.weights_by_source()))

    def weights_by_source(self) -> dict[str, float]:
        """The current sampling weights of the sources in the mix (base weight > 0)."""
        return {
            s: w for s, w, b in zip(SOURCE_NAMES, self.weights, self.base, strict=True) if b > 0
        }

    def event(self, step: int, *, last: bool) -> DataWeightsObserved | None:
        """The `data_weights` observation when one is due at ``step``."""
        if not (last or step % self.cfg.journal_every == 0):
            return None
        mixed = [i for i, b in enumerate(self.base) if b > 0]
        return DataWeightsObserved(
            weights={SOURCE_NAMES[i]: self.weights[i] for i in mixed},
            quality={SOURCE_NAMES[i]: self.quality[i] for i in mixed},
            losses={SOURCE_NAMES[i]: self.losses[i] for i in mixed},
            tokens={SOURCE_NAMES[i]: self.tokens[i] for i in mixed},
        )

    def state_dict(self) -> dict[str, Any]:
        """Scores and weights (plain floats: the checkpoint loads with weights_only)."""
        return {
            "sources": list(SOURCE_NAMES),
            "quality": list(self.quality),
            "weights": list(self.weights),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from scores and weights saved by `state_dict`."""
        saved = list(state["sources"])
        by_name = dict(
            zip(saved, zip(state["quality"], state["weights"], strict=True), strict=True)
        )
        # A checkpoint written before a source was added has no entry for it: base weight.
        self.quality = [float(by_name[s][0]) if s in by_name else 1.0 for s in SOURCE_NAMES]
        self.weights = [
            float(by_name[s][1]) if s in by_name else b
            for s, b in zip(SOURCE_NAMES, self.base, strict=True)
        ]
