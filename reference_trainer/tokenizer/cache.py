"""An optional folder of trained tokenizers shared by fresh runs of one configuration, so
that a suite of runs trains each BPE once (``TIGHTROPE_TOKENIZER_CACHE``; the tests set it).

An entry is JSON: the exact bytes of a run's ``tokenizer.json`` and their SHA-256, checked
before use; an entry that does not match is ignored, and the tokenizer trained again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import tokenizers

from reference_trainer.model.gpt import GPTConfig
from reference_trainer.tokenizer.keep_whole import TokenizerConfig

#: The environment variable naming the cache folder; unset or empty: no cache.
ENV = "TIGHTROPE_TOKENIZER_CACHE"


def cache_folder() -> Path | None:
    """The folder named by `ENV`, or None when the cache is off."""
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


class CorpusSettings(Protocol):
    """What a trained tokenizer depends on of the run's ``data`` settings
    (`reference_trainer.stream.data.DataConfig`)."""

    @property
    def source_weights(self) -> Mapping[str, float]: ...
    @property
    def seed(self) -> int: ...
    @property
    def tokenizer_docs(self) -> int: ...
    @property
    def tokenizer(self) -> TokenizerConfig: ...


class RunSettings(Protocol):
    """What `cache_key` reads of a run's configuration (`reference_trainer.config.TrainConfig`)."""

    @property
    def data(self) -> CorpusSettings: ...
    @property
    def model(self) -> GPTConfig: ...


def cache_key(cfg: RunSettings) -> str:
    """A digest of everything the trained tokenizer depends on: the corpus (sources and
    seed), how many documents it is trained on, its size, how it is built, the library."""
    inputs = {
        "source_weights": dict(sorted(cfg.data.source_weights.items())),
        "corpus_seed": cfg.data.seed,
        "tokenizer_docs": cfg.data.tokenizer_docs,
        "vocab_size": cfg.model.vocab_size,
        "tokenizer": dataclasses.asdict(cfg.data.tokenizer),
        "tokenizers": tokenizers.__version__,
    }
    text = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _entry(folder: Path, key: str) -> Path:
    return folder / f"{key}.json"


def cached(folder: Path, key: str) -> bytes | None:
    """The tokenizer file stored under ``key``, or None if absent, unreadable or not the
    bytes its digest names."""
    try:
        entry = json.loads(_entry(folder, key).read_text())
        data = bytes.fromhex(entry["tokenizer_hex"])
        digest = entry["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data if hashlib.sha256(data).hexdigest() == digest else None


def store(folder: Path, key: str, data: bytes) -> None:
    """Keep ``data`` (a tokenizer file) under ``key``, atomically; a failure to write only
    means the next run trains its own."""
    entry = {"sha256": hashlib.sha256(data).hexdigest(), "tokenizer_hex": data.hex()}
    path = _entry(folder, key)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def restore(data: bytes, path: Path) -> None:
    """Write a cached tokenizer file to ``path`` atomically (a reader never sees half)."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
