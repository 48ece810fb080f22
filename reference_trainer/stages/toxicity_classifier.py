"""Tier 2 of the toxicity filter: a classifier that scores a text in [0, 1] (1 = toxic).

Pluggable behind `ToxicityClassifier`. Two backends:

- ``head`` (the default, offline): a logistic-regression head on all-MiniLM-L6-v2 sentence
  embeddings (`SentenceEmbedder`), its weights shipped as ``toxicity_head.npz`` beside this
  module and trained by ``python -m reference_trainer.stages.train_toxicity_head``
  on the generated labelled set (toxicity_corpus.py). The file also holds how it was
  trained (seed, size) and its held-out precision and recall; it is read with
  ``allow_pickle=False``.
- ``detoxify``: the `detoxify` package's model, used only when configured and when its
  checkpoint (and the tokenizer/config files it needs) are on local disk; detoxify would
  otherwise download them, which a run must never do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from reference_trainer.errors import ConfigError
from reference_trainer.stages.embeddings import DIM, SentenceEmbedder

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

#: The shipped head, trained by train_toxicity_head.py.
HEAD_PATH = Path(__file__).with_name("toxicity_head.npz")


class ToxicityClassifier(Protocol):
    """Scores texts: one probability of toxicity in [0, 1] per text, in order."""

    def score(self, texts: Sequence[str]) -> list[float]:
        """One score per text in [0, 1]; a pure function of the text."""
        ...


@dataclass(frozen=True, slots=True)
class LogisticHead:
    """sigmoid(x . weights + bias) over an L2-normalized embedding x."""

    weights: F64
    bias: float
    #: How it was made and how it did on held-out items (plain numbers, for reports).
    meta: dict[str, float]

    def __post_init__(self) -> None:
        if self.weights.shape != (DIM,) or not np.all(np.isfinite(self.weights)):
            raise ValueError(f"toxicity head weights must be {DIM} finite numbers")
        if not math.isfinite(self.bias):
            raise ValueError("toxicity head bias must be finite")

    def probabilities(self, vectors: F32) -> F64:
        """The head's probability per row of ``vectors``."""
        z = vectors.astype(np.float64) @ self.weights + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))

    def save(self, path: Path) -> None:
        """Write weights, bias and ``meta`` as a plain .npz (no pickled objects)."""
        meta = {f"meta_{k}": np.float64(v) for k, v in self.meta.items()}
        np.savez(path, weights=self.weights, bias=np.float64(self.bias), **meta)  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: Path = HEAD_PATH) -> LogisticHead:
        """Read a head written by `save`; a clear error when missing or malformed."""
        if not path.is_file():
            raise ConfigError(
                f"toxicity head {path} is missing; train it with "
                "python -m reference_trainer.stages.train_toxicity_head"
            )
        try:
            with np.load(path, allow_pickle=False) as data:
                weights = np.asarray(data["weights"], dtype=np.float64)
                bias = float(data["bias"])
                meta = {k[5:]: float(data[k]) for k in data.files if k.startswith("meta_")}
            return cls(weights, bias, meta)
        except (KeyError, ValueError, OSError) as exc:
            raise ConfigError(f"toxicity head {path} is not a valid head file: {exc}") from None


class EmbeddingHeadClassifier:
    """The default backend: `LogisticHead` over `SentenceEmbedder` vectors."""

    def __init__(self, head: LogisticHead, embedder: SentenceEmbedder | None = None) -> None:
        self.head = head
        self.embedder = embedder or SentenceEmbedder()

    def score(self, texts: Sequence[str]) -> list[float]:
        """The head's probability of toxicity per text."""
        if not texts:
            return []
        return [float(p) for p in self.head.probabilities(self.embedder.encode(texts))]


class DetoxifyClassifier:
    """The optional `detoxify` backend from local files only; its "toxicity" output."""

    def __init__(self, checkpoint: str | None, config_dir: str | None, device: str = "cpu") -> None:
        missing = []
        try:
            import detoxify
        except ImportError:
            detoxify = None
            missing.append("the detoxify package (pip install detoxify)")
        if not checkpoint or not Path(checkpoint).is_file():
            missing.append(
                f"its checkpoint file (stability.toxicity.detoxify_checkpoint={checkpoint!r})"
            )
        if not config_dir or not Path(config_dir).is_dir():
            missing.append(
                "its local tokenizer/config folder "
                f"(stability.toxicity.detoxify_config_dir={config_dir!r})"
            )
        if missing:
            raise ConfigError(
                "the detoxify toxicity backend needs, on local disk: "
                + "; ".join(missing)
                + " (nothing is downloaded at run time; the default backend 'head' needs none)"
            )
        self._model: Any = detoxify.Detoxify(
            "original", checkpoint=checkpoint, device=device, huggingface_config_path=config_dir
        )

    def score(self, texts: Sequence[str]) -> list[float]:
        """detoxify's toxicity probability per text."""
        if not texts:
            return []
        return [float(p) for p in self._model.predict(list(texts))["toxicity"]]
