"""The three-tier toxicity filter as a document stage (docs/data.md, "Toxicity filter").

Tier 1 (toxicity_lexicon.py) scans every document for lexicon terms; a document without a
hit is kept at once. Tier 2 (toxicity_classifier.py) scores only the flagged documents: each
sentence holding a hit (cut to ``max_sentence_words`` around the hit) is scored and the
document's score is the highest. A score >= ``drop_above`` drops the document ("toxic"),
<= ``keep_below`` keeps it, anything between is ambiguous: tier 3. An ambiguous document is
appended to the run's review queue (rank 0 alone writes it) and, with ``hold_ambiguous``
(the default), held out of training ("held"); `tightrope review` lists the queue and
records accept/reject decisions.

Decisions are read once, when the stage is built (a start or a resume). A document with a
decision is not scored: accepted, it is trained on; rejected, it is dropped ("rejected").
The stream only moves forward, so a decision takes effect when the document is met again:
after a resume or a rollback to a checkpoint from before it, or in a new run over the same
data. Verdicts depend only on the document and the decisions read at start, so the
stage's state is its counters alone. (One caveat: the embedding of a sentence moves by
~1e-7 with the padding of the batch it is embedded in, so a score that close to a
threshold could flip under another batching; a resumed run repeats the calls of the run
it continues, so its batches, and its verdicts, are the same.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.records.review import (
    EXCERPT_CHARS,
    QueueEntry,
    append_entry,
    document_id,
    read_decisions,
    read_queue,
)
from harness.run_layout import RunLayout
from reference_trainer.stages.embeddings import SentenceEmbedder
from reference_trainer.stages.stage import KEPT, StageVerdict
from reference_trainer.stages.toxicity_classifier import (
    DetoxifyClassifier,
    EmbeddingHeadClassifier,
    LogisticHead,
    ToxicityClassifier,
)
from reference_trainer.stages.toxicity_lexicon import Hit, PatternMatcher

BACKENDS = ("head", "detoxify")
_SENTENCE_END = re.compile(r"[.!?](?=\s)")


@dataclass(kw_only=True, slots=True)
class ToxicityConfig:
    """Settings of the toxicity filter; ``enabled=False`` keeps every document unscanned."""

    enabled: bool = True
    backend: str = "head"
    """Tier 2: "head" (offline, shipped) or "detoxify" (its files must be on local disk)."""
    drop_above: float = 0.8
    """A score at or above this drops the document as toxic."""
    keep_below: float = 0.3
    """A score at or below this keeps it; between the two it goes to the review queue."""
    hold_ambiguous: bool = True
    """Queued documents are held out of training (False: queued and trained on)."""
    max_sentence_words: int = 64
    """Words around a hit that tier 2 reads when its sentence is longer."""
    detoxify_checkpoint: str | None = None
    detoxify_config_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("enabled", "hold_ambiguous"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"stability.toxicity.{name} must be a bool (got {getattr(self, name)!r})"
                )
        if self.backend not in BACKENDS:
            raise ValueError(
                f"stability.toxicity.backend must be one of {', '.join(BACKENDS)} "
                f"(got {self.backend!r})"
            )
        for name in ("drop_above", "keep_below"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
                raise ValueError(f"stability.toxicity.{name} must be in [0, 1] (got {v!r})")
        if self.keep_below > self.drop_above:
            raise ValueError(
                "stability.toxicity.keep_below must be <= stability.toxicity.drop_above "
                f"({self.keep_below} > {self.drop_above})"
            )
        w = self.max_sentence_words
        if isinstance(w, bool) or not isinstance(w, int) or w < 4:
            raise ValueError(
                f"stability.toxicity.max_sentence_words must be an int >= 4 (got {w!r})"
            )


def build_classifier(
    config: ToxicityConfig, embedder: SentenceEmbedder | None = None
) -> ToxicityClassifier:
    """The configured tier-2 backend (the head is read now; the embedder loads on first use;
    ``embedder``: one shared with other stages)."""
    if config.backend == "detoxify":
        return DetoxifyClassifier(config.detoxify_checkpoint, config.detoxify_config_dir)
    return EmbeddingHeadClassifier(LogisticHead.load(), embedder)


def hit_sentences(text: str, hits: Sequence[Hit], max_words: int) -> list[str]:
    """The sentences of ``text`` (normalized as tier 1 saw it) that hold a hit, each cut
    to ``max_words`` words around its first hit, in order, without repeats."""
    from reference_trainer.stages.toxicity_lexicon import normalize_text

    low = normalize_text(text)
    starts = [0] + [m.end() + 1 for m in _SENTENCE_END.finditer(low)]
    out: list[str] = []
    for hit in hits:
        first = max(s for s in starts if s <= hit.start)
        later = [s for s in starts if s > hit.start]
        sentence_end = later[0] - 1 if later else len(low)
        before = low[first : hit.start].split()
        after = low[hit.start : sentence_end].split()
        if len(before) + len(after) > max_words:
            keep_before = min(len(before), max_words // 2)
            before = before[len(before) - keep_before :]
            after = after[: max_words - keep_before]
        sentence = " ".join(before + after)
        if sentence not in out:
            out.append(sentence)
    return out


class ToxicityStage:
    """The cascade as a `DocumentStage` named ``toxicity_filter``."""

    name = "toxicity_filter"

    def __init__(
        self,
        config: ToxicityConfig,
        *,
        run_dir: Path | None = None,
        writes_queue: bool = True,
        classifier: ToxicityClassifier | None = None,
        embedder: SentenceEmbedder | None = None,
    ) -> None:
        self.config = config
        self.matcher = PatternMatcher()
        # Built now, so a missing head file or detoxify checkpoint stops the run at its
        # start; the embedding model itself loads on the first flagged document.
        if classifier is None and config.enabled:
            classifier = build_classifier(config, embedder)
        self._classifier = classifier
        layout = RunLayout(run_dir) if run_dir is not None else None
        self.queue_path = layout.review_queue if layout and writes_queue else None
        self.decisions = read_decisions(layout.review_decisions) if layout else {}
        # Ids already queued (by this run or the one it resumes) are not queued twice.
        self._queued = {e.id for e in read_queue(self.queue_path)} if self.queue_path else set()
        self.stats = {"seen": 0, "flagged": 0, "scored": 0, "toxic": 0, "held": 0}
        self.stats |= {"accepted": 0, "rejected": 0}

    @property
    def classifier(self) -> ToxicityClassifier:
        """Tier 2 (a run whose documents never hit the lexicon never loads its model)."""
        if self._classifier is None:
            self._classifier = build_classifier(self.config)
        return self._classifier

    def check_batch(self, documents: Sequence[Any]) -> list[StageVerdict]:
        """Tier 1 on every document, tier 2 on the flagged ones, tier 3 for the ambiguous."""
        self.stats["seen"] += len(documents)
        if not self.config.enabled:
            return [KEPT] * len(documents)
        verdicts: list[StageVerdict | None] = [None] * len(documents)
        pending: list[tuple[int, str, list[str]]] = []
        for i, doc in enumerate(documents):
            hits = self.matcher.hits(doc.text)
            if not hits:
                verdicts[i] = KEPT
                continue
            self.stats["flagged"] += 1
            doc_id = document_id(int(doc.index), doc.text)
            decided = self.decisions.get(doc_id)
            if decided is not None:
                self.stats["accepted" if decided == "accept" else "rejected"] += 1
                verdicts[i] = KEPT if decided == "accept" else StageVerdict(False, "rejected")
                continue
            pending.append(
                (i, doc_id, hit_sentences(doc.text, hits, self.config.max_sentence_words))
            )
        if pending:
            # One classifier call per batch: the embedder batches the sentences itself.
            flat = [s for _, _, sentences in pending for s in sentences]
            scores = iter(self.classifier.score(flat))
            self.stats["scored"] += len(flat)
            for i, doc_id, sentences in pending:
                doc_scores = [next(scores) for _ in sentences]
                best = max(doc_scores)
                verdicts[i] = self._verdict(
                    documents[i], doc_id, best, sentences[doc_scores.index(best)]
                )
        return [v if v is not None else KEPT for v in verdicts]

    def _verdict(self, doc: Any, doc_id: str, score: float, sentence: str) -> StageVerdict:
        if score >= self.config.drop_above:
            self.stats["toxic"] += 1
            return StageVerdict(False, "toxic")
        if score <= self.config.keep_below:
            return KEPT
        self.stats["held"] += 1
        if self.queue_path is not None and doc_id not in self._queued:
            self._queued.add(doc_id)
            entry = QueueEntry(
                doc_id, int(doc.index), str(doc.source), round(score, 4), sentence[:EXCERPT_CHARS]
            )
            append_entry(self.queue_path, entry)
        return StageVerdict(False, "held") if self.config.hold_ambiguous else KEPT

    def state_dict(self) -> dict[str, Any]:
        """The counters (verdicts themselves need no state: see the module docstring)."""
        return {"version": 1, "stats": dict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters."""
        if int(state.get("version", 0)) != 1:
            raise ValueError(f"unsupported toxicity_filter state version {state.get('version')!r}")
        self.stats.update({k: int(v) for k, v in state["stats"].items()})
