"""Benchmark of the toxicity filter: tier-1 speed, tier-2 speed, the cascade's cost on clean
documents, and the classifier's held-out precision and recall.

    .venv/bin/python benchmarks/toxicity.py [--texts 1000000] [--out PATH]

Tier 1: ``--texts`` short texts (sentences cut from the corpus and the labelled set, a pool
of distinct ones cycled) through pyahocorasick (`PatternMatcher.flags`, one call per text,
what the filter does), the plain-Python baseline (`RegexMatcher`: one ``re`` alternation
between ``\\b``), hyperscan when installed (one database, one ``scan`` per text), and
pyahocorasick over all texts joined in one pass (the automaton's own speed, without the
per-call overhead). Tier 2: sentences per second of the default head (embedding included,
model loaded first). Cascade: the whole stage on clean corpus documents of the tiny
preset's data settings, per 1,000 documents: milliseconds (and tier 1's share), documents
flagged, sentences scored, documents dropped or held (all false positives: the corpus
holds no toxic text); then the same with 5% `toxic_contamination` posts mixed in.
Classifier: precision and recall at 0.8 and 0.5 on the held-out split the head's file
names, the document-level outcome of the cascade on it, and on 300 posts of the
`toxic_contamination` fault. JSON to benchmarks/results/toxicity.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faults.data import StreamDocument
from faults.toxic import ToxicContaminationSpec, ToxicStream, toxic_text
from reference_trainer.config import preset
from reference_trainer.corpus.corpus import Corpus
from reference_trainer.stages.toxicity import ToxicityConfig, ToxicityStage
from reference_trainer.stages.toxicity_classifier import (
    EmbeddingHeadClassifier,
    LogisticHead,
)
from reference_trainer.stages.toxicity_corpus import (
    corpus_sentences,
    labelled_set,
)
from reference_trainer.stages.toxicity_lexicon import (
    LEXICON,
    PatternMatcher,
    RegexMatcher,
    normalize_text,
)
from reference_trainer.stages.train_toxicity_head import precision_recall

RESULTS = Path(__file__).resolve().parent / "results" / "toxicity.json"


def _timed(fn: Any, texts: list[str]) -> tuple[float, int]:
    started = time.perf_counter()
    flagged = sum(1 for t in texts if fn(t))
    return time.perf_counter() - started, flagged


def tier1(count: int) -> list[dict[str, Any]]:
    """Seconds and texts/s of each matcher over ``count`` short texts."""
    pool = corpus_sentences(7, 15_000) + [i.text for i in labelled_set("heldout", 7, 5_000)]
    texts = list(itertools.islice(itertools.cycle(pool), count))
    rows = []
    aho, regex = PatternMatcher(), RegexMatcher()
    for name, fn in (("pyahocorasick", aho.flags), ("regex alternation (baseline)", regex.flags)):
        seconds, flagged = _timed(fn, texts)
        rows.append({"matcher": name, "seconds": seconds, "flagged": flagged})
    try:
        import hyperscan
    except ImportError:
        hyperscan = None
    if hyperscan is not None:
        db = hyperscan.Database()
        patterns = [rf"\b{t}\b".replace(" ", r"\s+").encode() for t in LEXICON]
        flag = hyperscan.HS_FLAG_CASELESS | hyperscan.HS_FLAG_SINGLEMATCH
        db.compile(
            expressions=patterns, ids=list(range(len(patterns))), flags=[flag] * len(patterns)
        )
        found: list[int] = []

        def on_match(*_: Any) -> bool:
            found.append(1)
            return True  # stop at the first match

        def hs_flags(text: str) -> bool:
            try:
                db.scan(normalize_text(text).encode(), match_event_handler=on_match)
            except hyperscan.ScanTerminated:  # the handler stopped it: a match
                return True
            return False

        seconds, flagged = _timed(hs_flags, texts)
        rows.append({"matcher": "hyperscan", "seconds": seconds, "flagged": flagged})
    joined = "\n".join(normalize_text(t) for t in texts)
    started = time.perf_counter()
    hits = sum(1 for _ in aho._automaton.iter(joined))
    rows.append(
        {
            "matcher": "pyahocorasick, one pass (raw hits, no boundary check)",
            "seconds": time.perf_counter() - started,
            "flagged": None,
            "raw_hits": hits,
        }
    )
    for row in rows:
        row["texts"] = count
        row["texts_per_s"] = count / row["seconds"]
    return rows


def tier2(classifier: EmbeddingHeadClassifier) -> dict[str, Any]:
    """Sentences per second of the head, embedding included (model already loaded)."""
    texts = corpus_sentences(11, 512)
    started = time.perf_counter()
    classifier.score(texts)
    seconds = time.perf_counter() - started
    return {"sentences": len(texts), "seconds": seconds, "sentences_per_s": len(texts) / seconds}


def cascade(classifier: EmbeddingHeadClassifier, docs: int, rate: float = 0.0) -> dict[str, Any]:
    """The stage on corpus documents (with toxic posts mixed in at ``rate``), per 1,000."""
    data = preset("tiny").data
    corpus = Corpus(data.source_weights, data.seed)
    stream: Any = corpus.documents()
    if rate:
        stream = ToxicStream(ToxicContaminationSpec(at_step=1, rate=rate, seed=1), stream)
    documents = [next(stream) for _ in range(docs)]
    stage = ToxicityStage(ToxicityConfig(), classifier=classifier)
    started = time.perf_counter()
    verdicts = []
    for k in range(0, docs, 16):  # the pipeline's batches are this size or smaller
        verdicts += stage.check_batch(documents[k : k + 16])
    seconds = time.perf_counter() - started
    per = 1000 / docs
    started = time.perf_counter()
    for doc in documents:
        stage.matcher.hits(doc.text)
    tier1_s = time.perf_counter() - started
    whole = [d.text for d in documents[:64]]
    started = time.perf_counter()
    classifier.score(whole)
    every_doc_ms = (time.perf_counter() - started) / len(whole) * 1000 * 1000
    return {
        "documents": docs,
        "ms_per_1000_docs": seconds * 1000 * per,
        "tier1_ms_per_1000_docs": tier1_s * 1000 * per,
        "flagged_per_1000": stage.stats["flagged"] * per,
        "sentences_scored_per_1000": stage.stats["scored"] * per,
        "dropped_per_1000": sum(v.reason == "toxic" for v in verdicts) * per,
        "held_per_1000": sum(v.reason == "held" for v in verdicts) * per,
        "ms_per_1000_docs_if_every_doc_were_scored": every_doc_ms,
    }


def quality(classifier: EmbeddingHeadClassifier) -> dict[str, Any]:
    """Held-out precision/recall of the head alone, and document outcomes of the cascade."""
    head = classifier.head
    seed, size = int(head.meta["heldout_seed"]), int(head.meta["heldout_size"])
    items = labelled_set("heldout", seed, size)
    scores = classifier.score([i.text for i in items])
    labels = [i.label for i in items]
    out: dict[str, Any] = {"heldout_seed": seed, "heldout_size": size}
    for at in (0.8, 0.5):
        p, r = precision_recall(scores, labels, at)
        out[f"head_precision_at_{at}"], out[f"head_recall_at_{at}"] = p, r
    by_kind: dict[str, dict[str, int]] = {}
    stage = ToxicityStage(ToxicityConfig(), classifier=classifier)
    docs = [StreamDocument(n, "heldout", i.text) for n, i in enumerate(items)]
    for item, verdict in zip(items, stage.check_batch(docs), strict=True):
        row = by_kind.setdefault(item.kind, {})
        row[verdict.reason] = row.get(verdict.reason, 0) + 1
    out["cascade_by_kind"] = by_kind
    posts = [StreamDocument(-k, "social_chatter", toxic_text(1, k, 0.3)) for k in range(1, 301)]
    outcome: dict[str, int] = {}
    for verdict in ToxicityStage(ToxicityConfig(), classifier=classifier).check_batch(posts):
        outcome[verdict.reason] = outcome.get(verdict.reason, 0) + 1
    out["fault_posts_300"] = outcome
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=1_000_000, help="tier-1 texts")
    parser.add_argument("--docs", type=int, default=2000, help="clean documents for the cascade")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows = tier1(args.texts)
    classifier = EmbeddingHeadClassifier(LogisticHead.load())
    started = time.perf_counter()
    classifier.score(["warm up the model"])
    load_s = time.perf_counter() - started
    result = {
        "tier1": rows,
        "tier2": tier2(classifier) | {"model_load_s": load_s},
        "cascade": cascade(classifier, args.docs),
        "cascade_5pct_toxic": cascade(classifier, args.docs, rate=0.05),
        "classifier": quality(classifier),
        "load_average_before": load,
        "load_average_after": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'tier 1 matcher':<56} {'seconds':>8} {'texts/s':>12} {'flagged':>8}")
    for row in rows:
        flagged = "-" if row["flagged"] is None else str(row["flagged"])
        print(
            f"{row['matcher']:<56} {row['seconds']:8.2f} {row['texts_per_s']:12,.0f} {flagged:>8}"
        )
    t2 = result["tier2"]
    print(f"\ntier 2: {t2['sentences_per_s']:.0f} sentences/s (model load {load_s:.1f} s)")
    for name in ("cascade", "cascade_5pct_toxic"):
        for key, value in result[name].items():
            print(f"{name} {key:<44} {value:10.1f}")
    print(json.dumps(result["classifier"], indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
