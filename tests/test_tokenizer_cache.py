"""The shared tokenizer cache: a fresh run given a cached tokenizer writes the very bytes
it would have trained, and an entry that does not match its digest is never used."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from harness.run_layout import RunLayout
from reference_trainer.build import _tokenizer
from reference_trainer.config import preset
from reference_trainer.corpus.corpus import Corpus
from reference_trainer.processes.distributed import Topology
from reference_trainer.tokenizer import cache as tokenizer_cache

ONE = Topology(rank=0, world_size=1, local_rank=0, restart=0, device=torch.device("cpu"))


def fresh_tokenizer(run_dir: Path, monkeypatch: pytest.MonkeyPatch, cache: Path | None) -> bytes:
    """The tokenizer file a fresh tiny run writes, with or without a cache folder."""
    monkeypatch.setenv(tokenizer_cache.ENV, str(cache) if cache else "")
    cfg = preset("tiny")
    run_dir.mkdir()
    _tokenizer(cfg, run_dir, Corpus(cfg.data.source_weights, cfg.data.seed), ONE)
    return RunLayout(run_dir).tokenizer.read_bytes()


def test_a_cached_tokenizer_is_the_one_the_run_would_have_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained = fresh_tokenizer(tmp_path / "uncached", monkeypatch, None)
    cache = tmp_path / "cache"
    first = fresh_tokenizer(tmp_path / "first", monkeypatch, cache)  # trains and stores
    assert len(list(cache.glob("*.json"))) == 1
    second = fresh_tokenizer(tmp_path / "second", monkeypatch, cache)  # from the cache
    assert first == second == trained
    # Another configuration is another entry.
    other = preset("tiny")
    other.model.vocab_size = 1024
    assert tokenizer_cache.cache_key(other) != tokenizer_cache.cache_key(preset("tiny"))


def test_an_entry_that_does_not_match_its_digest_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    trained = fresh_tokenizer(tmp_path / "first", monkeypatch, cache)
    (entry,) = cache.glob("*.json")
    fields = json.loads(entry.read_text())
    forged = trained.replace(b'"<|endoftext|>"', b'"<|forged|>"', 1)
    assert forged != trained
    entry.write_text(json.dumps(fields | {"tokenizer_hex": forged.hex()}))
    key = tokenizer_cache.cache_key(preset("tiny"))
    assert tokenizer_cache.cached(cache, key) is None  # the digest names other bytes
    assert fresh_tokenizer(tmp_path / "second", monkeypatch, cache) == trained
    # Negative control of the check: the same forgery with its own digest is taken.
    forged_digest = hashlib.sha256(forged).hexdigest()
    entry.write_text(json.dumps({"sha256": forged_digest, "tokenizer_hex": forged.hex()}))
    assert tokenizer_cache.cached(cache, key) == forged
