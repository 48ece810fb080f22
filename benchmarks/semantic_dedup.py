"""Semantic dedup: recall on paraphrases the hash filter misses, false drops on clean
documents, and what candidate generation saves against embedding every document.

For each prose source (and code), N originals of the built-in corpus go through the
trainer's hash filter and the semantic stage; then a paraphrase of each (the
`paraphrase_contamination` fault's generator: synonyms swapped at 0.8, sentences reordered
at 0.5). Reported per source: how many copies the hash filter caught, how many of the rest
the semantic stage caught (its recall), clean originals it dropped (false drops) and how
many documents it embedded. The named baseline for cost is "embed every document": the
stage's embedding time is reported as a ratio to the time that embedding all of them takes,
measured in the same process on the same texts; the second measure, the one that decides
what the stage costs a run, streams clean documents of the default mix through it.

    .venv/bin/python benchmarks/semantic_dedup.py [--docs 100] [--clean 1000]

Writes benchmarks/results/semantic_dedup.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from faults.paraphrase import paraphrase  # noqa: E402
from reference_trainer.corpus.corpus import Corpus, generate_text  # noqa: E402
from reference_trainer.stability.mechanisms import StabilityConfig  # noqa: E402
from reference_trainer.stages.dedup import DuplicateFilter  # noqa: E402
from reference_trainer.stages.embeddings import SentenceEmbedder  # noqa: E402
from reference_trainer.stages.semantic_dedup import (  # noqa: E402
    SemanticDedupConfig,
    SemanticDedupStage,
)

SOURCES = ("technical_docs", "social_chatter", "product_reviews", "code")


@dataclass(frozen=True)
class Doc:
    index: int
    source: str
    text: str


def measure(source: str, n: int, embedder: SentenceEmbedder) -> dict[str, float]:
    """One source's figures."""
    docs = [Doc(i, source, generate_text(source, 1234, i)) for i in range(n)]
    copies = [
        Doc(-1 - i, source, paraphrase(d.text, 0.8, 0.5, random.Random(i)))
        for i, d in enumerate(docs)
    ]
    hashes = DuplicateFilter(StabilityConfig().dedup)
    hashes.check_batch([(d.index, d.text) for d in docs])
    kept = hashes.check_batch([(c.index, c.text) for c in copies])
    missed = [c for c, v in zip(copies, kept, strict=True) if v.keep]
    stage = SemanticDedupStage(SemanticDedupConfig(), embedder)
    before = embedder.texts_embedded
    t0 = time.perf_counter()
    false_drops = sum(not v.keep for v in stage.check_batch(docs))
    caught = sum(not v.keep for v in stage.check_batch(missed))
    stage_s = time.perf_counter() - t0
    embedded = embedder.texts_embedded - before
    # The baseline: every original and every copy embedded (batched, as the stage embeds).
    texts = [d.text[:1000] for d in docs + missed]
    t0 = time.perf_counter()
    embedder.encode(texts)
    every_s = time.perf_counter() - t0
    return {
        "copies": n,
        "hash_caught": n - len(missed),
        "semantic_caught": caught,
        "rest": len(missed),
        "recall": caught / len(missed) if missed else 1.0,
        "false_drops": false_drops,
        "embedded": embedded,
        "documents": len(texts),
        "stage_s": stage_s,
        "embed_every_s": every_s,
        "cost_ratio": stage_s / every_s,
    }


def clean_stream(n: int, embedder: SentenceEmbedder) -> dict[str, float]:
    """The stage on ``n`` clean documents of the default mix, against embedding them all."""
    weights = {s: w for s, w in zip(SOURCES, (0.4, 0.2, 0.2, 0.2), strict=True)}
    corpus = Corpus(weights, 1234)
    docs = [corpus.document(i) for i in range(n)]
    stage = SemanticDedupStage(SemanticDedupConfig(), embedder)
    before = embedder.texts_embedded
    t0 = time.perf_counter()
    dropped = sum(not v.keep for v in stage.check_batch(docs))
    stage_s = time.perf_counter() - t0
    embedded = embedder.texts_embedded - before
    t0 = time.perf_counter()
    embedder.encode([d.text[:1000] for d in docs])
    every_s = time.perf_counter() - t0
    return {
        "documents": n,
        "candidates": stage.candidates,
        "embedded": embedded,
        "dropped": dropped,
        "stage_s": stage_s,
        "embed_every_s": every_s,
        "cost_ratio": stage_s / every_s,
    }


def main() -> None:
    """Measure every source, write the JSON, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100, help="originals per source")
    parser.add_argument("--clean", type=int, default=1000, help="clean documents streamed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    embedder = SentenceEmbedder()
    embedder.encode(["warm up"])  # the model's load is not the stage's cost
    rows = {source: measure(source, args.docs, embedder) for source in SOURCES}
    rest = sum(r["rest"] for r in rows.values())
    caught = sum(r["semantic_caught"] for r in rows.values())
    total = {
        "recall": caught / rest if rest else 1.0,
        "false_drops": sum(r["false_drops"] for r in rows.values()),
        "cost_ratio": sum(r["stage_s"] for r in rows.values())
        / sum(r["embed_every_s"] for r in rows.values()),
    }
    clean = clean_stream(args.clean, embedder)
    out = ROOT / "benchmarks" / "results" / "semantic_dedup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"docs_per_source": args.docs, "sources": rows, "total": total, "clean": clean},
            indent=2,
        )
    )
    print(
        f"{'source':16} {'hash caught':>11} {'semantic caught':>16} {'recall':>7} "
        f"{'false drops':>11} {'embedded':>9} {'cost vs embed-all':>17}"
    )
    for source, r in rows.items():
        hashed = f"{r['hash_caught']:>5}/{r['copies']:<5}"
        semantic = f"{r['semantic_caught']:>9}/{r['rest']:<6}"
        embedded = f"{r['embedded']:>4}/{r['documents']:<4}"
        print(
            f"{source:16} {hashed} {semantic} {r['recall']:>7.3f} {r['false_drops']:>11} "
            f"{embedded} {r['cost_ratio']:>16.2f}x"
        )
    print(
        f"{'all':16} {'':11} {caught:>9}/{rest:<6} {total['recall']:>7.3f} "
        f"{total['false_drops']:>11} {'':9} {total['cost_ratio']:>16.2f}x"
    )
    print(
        f"clean stream: {clean['documents']} documents, {clean['candidates']} candidates, "
        f"{clean['embedded']} embedded, {clean['dropped']} dropped; the stage took "
        f"{clean['stage_s']:.2f} s, {clean['cost_ratio']:.3f}x embedding them all "
        f"({clean['embed_every_s']:.1f} s, batched)"
    )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
