"""Train the toxicity classifier's logistic head and ship it as toxicity_head.npz.

    python -m reference_trainer.stages.train_toxicity_head [--out PATH]

The head is fitted with numpy (full-batch gradient descent on the L2-regularized log loss,
classes weighted to balance) on the embeddings of ``labelled_set("train", ...)`` and
judged on ``labelled_set("heldout", ...)``: other templates and other corpus sentences.
Precision and recall at ``drop_above`` (0.8, the filter's default) and at 0.5 go into the
file with the seeds and sizes, so a report can quote them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from reference_trainer.stages.embeddings import SentenceEmbedder
from reference_trainer.stages.toxicity_classifier import F32, F64, HEAD_PATH, LogisticHead
from reference_trainer.stages.toxicity_corpus import LabelledText, labelled_set

TRAIN_SEED, TRAIN_SIZE = 1, 1600
HELDOUT_SEED, HELDOUT_SIZE = 2, 600


def fit(
    vectors: F32, labels: Sequence[int], *, l2: float = 1e-3, steps: int = 3000
) -> tuple[F64, float]:
    """Weights and bias of the logistic regression that minimizes the weighted log loss."""
    x = vectors.astype(np.float64)
    y = np.asarray(labels, dtype=np.float64)
    pos = max(float(y.sum()), 1.0)
    neg = max(float(len(y) - y.sum()), 1.0)
    weight = np.where(y == 1, len(y) / (2 * pos), len(y) / (2 * neg))
    w, b = np.zeros(x.shape[1]), 0.0
    lr = 2.0  # the rows have unit norm, so the loss is smooth enough for a large step
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w + b, -60, 60)))
        g = weight * (p - y) / len(y)
        w -= lr * (x.T @ g + l2 * w)
        b -= lr * float(g.sum())
    return w, b


def precision_recall(
    scores: Sequence[float], labels: Sequence[int], at: float
) -> tuple[float, float]:
    """Precision and recall of ``score >= at`` as the toxic call (nan when undefined)."""
    called = np.asarray(scores) >= at
    truth = np.asarray(labels) == 1
    tp = int(np.sum(called & truth))
    precision = tp / int(called.sum()) if called.any() else float("nan")
    recall = tp / int(truth.sum()) if truth.any() else float("nan")
    return precision, recall


def _embed(embedder: SentenceEmbedder, items: list[LabelledText]) -> F32:
    return embedder.encode([item.text for item in items])


def main(argv: Sequence[str] | None = None) -> int:
    """Train on the generated set, report held-out figures, write the head."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HEAD_PATH)
    args = parser.parse_args(argv)
    embedder = SentenceEmbedder()
    train = labelled_set("train", TRAIN_SEED, TRAIN_SIZE)
    heldout = labelled_set("heldout", HELDOUT_SEED, HELDOUT_SIZE)
    started = time.perf_counter()
    x_train, x_held = _embed(embedder, train), _embed(embedder, heldout)
    print(f"embedded {len(train) + len(heldout)} texts in {time.perf_counter() - started:.1f} s")
    w, b = fit(x_train, [i.label for i in train])
    probe = LogisticHead(w, b, {})
    scores = probe.probabilities(x_held).tolist()
    labels = [i.label for i in heldout]
    meta: dict[str, float] = {
        "train_seed": TRAIN_SEED,
        "train_size": TRAIN_SIZE,
        "heldout_seed": HELDOUT_SEED,
        "heldout_size": HELDOUT_SIZE,
    }
    for at, tag in ((0.8, "80"), (0.5, "50")):
        precision, recall = precision_recall(scores, labels, at)
        meta[f"heldout_precision_{tag}"], meta[f"heldout_recall_{tag}"] = precision, recall
        print(f"held-out at {at}: precision {precision:.3f} recall {recall:.3f}")
    train_p, train_r = precision_recall(
        probe.probabilities(x_train).tolist(), [i.label for i in train], 0.8
    )
    print(f"train at 0.8: precision {train_p:.3f} recall {train_r:.3f}")
    LogisticHead(w, b, meta).save(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
