"""Tier 2: the shipped logistic head on sentence embeddings separates held-out toxic items
from clean ones (templates and sentences it was not trained on), a broken head does not
(the negative control), and the detoxify backend refuses to run without its local files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reference_trainer.errors import ConfigError
from reference_trainer.stages import embeddings
from reference_trainer.stages.toxicity import (
    ToxicityConfig,
    ToxicityStage,
    build_classifier,
)
from reference_trainer.stages.toxicity_classifier import (
    DetoxifyClassifier,
    LogisticHead,
)
from reference_trainer.stages.toxicity_corpus import labelled_set
from reference_trainer.stages.train_toxicity_head import fit, precision_recall

needs_model = pytest.mark.skipif(
    not embeddings.available(), reason="the embedding model (the semantic extra) is not installed"
)


@pytest.fixture(scope="module")
def heldout() -> tuple[np.ndarray, list[int]]:
    """Embeddings and labels of 200 held-out items of a seed the head never saw."""
    items = labelled_set("heldout", 3, 200)
    vectors = embeddings.SentenceEmbedder().encode([i.text for i in items])
    return vectors, [i.label for i in items]


@pytest.mark.slow
@needs_model
def test_the_shipped_head_is_precise_and_finds_most_toxic_items(
    heldout: tuple[np.ndarray, list[int]],
) -> None:
    vectors, labels = heldout
    head = LogisticHead.load()
    precision, recall = precision_recall(head.probabilities(vectors).tolist(), labels, 0.8)
    assert precision >= 0.95 and recall >= 0.75, (precision, recall)
    # The file says how it was trained and what it measured on its own held-out split.
    assert head.meta["train_size"] > 0 and 0 <= head.meta["heldout_recall_80"] <= 1


@needs_model
def test_a_head_pointing_the_wrong_way_fails_the_same_bound(
    heldout: tuple[np.ndarray, list[int]],
) -> None:
    vectors, labels = heldout
    good = LogisticHead.load()
    wrong = LogisticHead(-good.weights, -good.bias, {})
    precision, recall = precision_recall(wrong.probabilities(vectors).tolist(), labels, 0.8)
    assert not (precision >= 0.95 and recall >= 0.75), (precision, recall)


def test_fit_separates_a_separable_set() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 384)).astype(np.float32)
    labels = (x[:, 0] > 0).astype(int).tolist()
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w, b = fit(x, labels, steps=500)
    p, r = precision_recall(LogisticHead(w, b, {}).probabilities(x).tolist(), labels, 0.5)
    assert p > 0.95 and r > 0.95


def test_a_missing_or_malformed_head_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="train_toxicity_head"):
        LogisticHead.load(tmp_path / "none.npz")
    bad = tmp_path / "bad.npz"
    np.savez(bad, weights=np.array([object()], dtype=object), bias=np.float64(0))
    with pytest.raises(ConfigError, match="not a valid head file"):
        LogisticHead.load(bad)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, weights=np.zeros(3), bias=np.float64(0))
    with pytest.raises(ConfigError, match="384"):
        LogisticHead.load(wrong)


def test_detoxify_without_local_files_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"detoxify_checkpoint=None.*detoxify_config_dir"):
        build_classifier(ToxicityConfig(backend="detoxify"))
    with pytest.raises(ConfigError, match="detoxify"):  # when the stage is built: at start
        ToxicityStage(ToxicityConfig(backend="detoxify"))
    ckpt = tmp_path / "toxic_original.ckpt"
    ckpt.write_bytes(b"")
    with pytest.raises(ConfigError) as caught:
        DetoxifyClassifier(str(ckpt), str(tmp_path / "no-config"))
    assert "detoxify_config_dir" in str(caught.value)
    assert "detoxify_checkpoint" not in str(caught.value)  # that one is there
    assert "nothing is downloaded" in str(caught.value)
