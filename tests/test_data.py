"""The training stream: special-token layout, tokenizer rules, resumable sharded loading."""

from __future__ import annotations

import pytest
import torch

from reference_trainer.config import DataConfig
from reference_trainer.corpus.corpus import Corpus
from reference_trainer.stream.data import (
    DocumentPipeline,
    ShardedLoader,
    TokenLayout,
    TokenStream,
)
from reference_trainer.tokenizer.bpe import EOT, train_tokenizer

EOT_ID = 0


def test_layout_places_eot_at_start_every_n_inside_and_twice_at_end() -> None:
    layout = TokenLayout(EOT_ID, at_start=1, every=4, at_end=2)
    body = list(range(1, 11))  # 10 tokens: breaks after 4 and 8
    assert layout.wrap(body) == [0, 1, 2, 3, 4, 0, 5, 6, 7, 8, 0, 9, 10, 0, 0]
    assert layout.wrap([1, 2, 3, 4]) == [0, 1, 2, 3, 4, 0, 0]  # no break at the very end


def test_default_layout_is_one_every_1024_two() -> None:
    layout = TokenLayout.from_config(DataConfig(), EOT_ID)
    out = layout.wrap(list(range(1, 2501)))
    eots = [i for i, t in enumerate(out) if t == EOT_ID]
    assert eots == [0, 1025, 2050, len(out) - 2, len(out) - 1]


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    corpus = Corpus(DataConfig().source_weights, seed=3)
    return train_tokenizer((corpus.document(i).text for i in range(300)), 512)


def test_tokenizer_splits_digits_one_by_one_and_punctuation_apart(tokenizer) -> None:  # type: ignore[no-untyped-def]
    tokens = tokenizer.encode("version 2026.11, costs $19.99!").tokens
    digits = [t.lstrip("Ġ") for t in tokens if any(c.isdigit() for c in t)]
    assert digits == list("2026") + list("11") + list("1999")
    for mark in ".,$!":
        assert any(t.lstrip("Ġ") == mark for t in tokens), (mark, tokens)
    assert tokenizer.token_to_id(EOT) == 0
    assert tokenizer.decode(tokenizer.encode("def f(x):\n    return 42").ids) == (
        "def f(x):\n    return 42"
    )


def _stream(tokenizer, window: int = 17) -> TokenStream:  # type: ignore[no-untyped-def]
    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    corpus = Corpus(DataConfig().source_weights, seed=5)
    return TokenStream(DocumentPipeline(corpus), encode, TokenLayout(EOT_ID), window)


def test_stream_resumes_exactly_from_its_state(tokenizer) -> None:  # type: ignore[no-untyped-def]
    straight = _stream(tokenizer)
    expected = straight.take(40) + straight.take(300)
    first = _stream(tokenizer)
    head = first.take(40)
    state = first.state_dict()
    second = _stream(tokenizer)
    second.load_state_dict(state)
    assert head + second.take(300) == expected


def test_ranks_split_the_same_global_batch_as_accumulation_on_one_rank(tokenizer) -> None:  # type: ignore[no-untyped-def]
    one = ShardedLoader(_stream(tokenizer), batch_size=2, grad_accum=2, rank=0, world_size=1)
    ranks = [
        ShardedLoader(_stream(tokenizer), batch_size=2, grad_accum=1, rank=r, world_size=2)
        for r in range(2)
    ]
    for _ in range(3):
        single = one.next_step()  # (accum=2, 2, window)
        shards = [loader.next_step()[0] for loader in ranks]
        assert torch.equal(single[0], shards[0]) and torch.equal(single[1], shards[1])
        assert not torch.equal(shards[0], shards[1])
    assert one.tokens_per_step() == ranks[0].tokens_per_step() == 4 * 16
