"""The tokenizer fallback: what counts as byte fallback, the threshold, the repair, the drop,
what it journals; and frequent words kept whole at tokenizer training."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from tokenizers import Tokenizer, pre_tokenizers

from faults.tokenizer_stress import StressedStream, TokenizerStressSpec
from reference_trainer.config import DataConfig, TrainConfig, preset
from reference_trainer.corpus.corpus import Corpus
from reference_trainer.errors import ConfigError
from reference_trainer.stability.registry import disable
from reference_trainer.stream.data import DocumentPipeline, TokenLayout, TokenStream
from reference_trainer.tokenizer.bpe import train_tokenizer
from reference_trainer.tokenizer.fallback import (
    FallbackConfig,
    FallbackProbe,
    TokenFallback,
    encodable,
    fallback_claims,
    repair,
)
from reference_trainer.tokenizer.keep_whole import (
    TokenizerConfig,
    byte_decoder,
    count_pieces,
    is_word,
    keep_whole,
    scaled_min_count,
)

PLAIN = "the model reads the data stream and writes a short report about it"


@dataclass(frozen=True)
class Doc:
    text: str
    source: str = "technical_docs"
    contamination_kind: str | None = None


@pytest.fixture(scope="module")
def texts() -> list[str]:
    corpus = Corpus(DataConfig().source_weights, seed=3)
    return [corpus.document(i).text for i in range(150)]


@pytest.fixture(scope="module")
def tokenizer(texts: list[str]) -> Tokenizer:
    return train_tokenizer(texts, 400)


def _encoder(tokenizer: Tokenizer):  # type: ignore[no-untyped-def]
    def encode(batch: list[str]) -> list[list[int]]:
        safe = [encodable(t) for t in batch]
        return [e.ids for e in tokenizer.encode_batch(safe, add_special_tokens=False)]

    return encode


def _rate(probe: FallbackProbe, tokenizer: Tokenizer, text: str) -> float:
    ids = np.asarray(tokenizer.encode(encodable(text), add_special_tokens=False).ids)
    return probe.count(ids) / len(ids)


# -- the measure -------------------------------------------------------------------------


def test_fragments_controls_and_replacement_chars_are_fallback_plain_text_is_not(
    tokenizer: Tokenizer,
) -> None:
    probe = FallbackProbe.of(tokenizer, max_digit_run=32)
    assert _rate(probe, tokenizer, PLAIN) == 0
    assert _rate(probe, tokenizer, "def f(x):\n\treturn 42\r\n") == 0  # tab/newline/CR are text
    assert _rate(probe, tokenizer, "привет мир") == 18 / 19  # 9 letters of 2 bytes, one " "
    assert _rate(probe, tokenizer, "a\x00b") == pytest.approx(1 / 3)
    assert _rate(probe, tokenizer, "\ufffd") == 1.0  # its 3 bytes, none a character alone
    assert probe.count(np.asarray([0])) == 0  # <|endoftext|> is not fallback


def test_only_digits_past_the_run_limit_count(tokenizer: Tokenizer) -> None:
    probe = FallbackProbe.of(tokenizer, max_digit_run=4)
    ids = np.asarray(tokenizer.encode("1234567 12 345678", add_special_tokens=False).ids)
    assert probe.count(ids) == 3 + 2  # 5,6,7 of the first run; 7,8 of the third
    rows = np.stack([ids, ids])
    assert probe.count(rows) == 10  # runs are counted along each row


def test_lone_surrogates_reach_the_tokenizer_as_replacement_chars(tokenizer: Tokenizer) -> None:
    broken = "data\udc80\udcff stream"
    with pytest.raises(TypeError):  # why every text goes through `encodable` first
        tokenizer.encode(broken)
    assert encodable(broken) == "data\ufffd\ufffd stream"


def test_repair_is_stated_and_in_order() -> None:
    text = "ｄａｔａ\x07 v\udc80al\ufffdue \u200b" + "9" * 50
    assert repair(text, max_digit_run=8) == "data value " + "9" * 8


# -- the mechanism -----------------------------------------------------------------------


def _fallback(tokenizer: Tokenizer, **fields: float) -> TokenFallback:
    cfg = FallbackConfig(**fields)  # type: ignore[arg-type]
    return TokenFallback(cfg, FallbackProbe.of(tokenizer, cfg.max_digit_run))


def test_repairable_documents_are_retokenized_and_kept(tokenizer: Tokenizer) -> None:
    fallback = _fallback(tokenizer)
    encode = _encoder(tokenizer)
    docs = [
        Doc(PLAIN),
        Doc("the\x00 data\x07 is\x1b here", "code"),
        Doc("value\udc80\udcff " * 8, contamination_kind="tokenizer_stress"),
    ]
    out = fallback.encode(docs, encode)
    assert out[0] == encode([PLAIN])[0]  # under the threshold: untouched
    assert out[1] == encode(["the data is here"])[0]
    assert out[2] == encode([("value " * 8)])[0]
    counters = fallback.take_counters()
    assert counters.by_source == {
        "technical_docs": {"docs": 2, "over": 1, "retokenized": 1, "dropped": 0},
        "code": {"docs": 1, "over": 1, "retokenized": 1, "dropped": 0},
    }
    assert counters.fallback_before > 0 and counters.fallback_after == 0
    assert (counters.stress_docs, counters.stress_dropped) == (1, 0)
    (claim,) = fallback_claims(counters)
    assert claim.detector == "tokenizer_fallback"
    assert claim.details["over"] == 2 and claim.details["dropped"] == 0
    assert claim.details["rate_before"] > 0.05 and claim.details["rate_after"] == 0
    assert fallback.take_counters().by_source == {}  # reset


def test_a_script_the_vocabulary_lacks_is_dropped(tokenizer: Tokenizer) -> None:
    fallback = _fallback(tokenizer)
    docs = [Doc("你好世界 数据 模型 " * 4, contamination_kind="tokenizer_stress"), Doc(PLAIN)]
    out = fallback.encode(docs, _encoder(tokenizer))
    assert out[0] is None and out[1]
    counters = fallback.take_counters()
    assert counters.by_source["technical_docs"]["dropped"] == 1
    assert counters.stress_dropped == 1
    assert fallback_claims(counters)[0].details["rate_after"] > 0.5


def test_the_threshold_is_respected(tokenizer: Tokenizer) -> None:
    # One control character in a plain text: a small share of its tokens.
    text = PLAIN + "\x07"
    share = _rate(FallbackProbe.of(tokenizer, 32), tokenizer, text)
    assert 0 < share < 0.2
    above = _fallback(tokenizer, threshold=share * 0.9)
    below = _fallback(tokenizer, threshold=share)  # "above the threshold": equal is not
    assert above.encode([Doc(text)], _encoder(tokenizer))[0] != _encoder(tokenizer)([text])[0]
    assert below.encode([Doc(text)], _encoder(tokenizer))[0] == _encoder(tokenizer)([text])[0]
    assert not fallback_claims(below.take_counters())
    assert fallback_claims(above.take_counters())


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"threshold": 0}, r"stability\.tokenizer_fallback\.threshold"),
        ({"threshold": 1.5}, r"stability\.tokenizer_fallback\.threshold"),
        ({"max_digit_run": 0}, r"stability\.tokenizer_fallback\.max_digit_run"),
        ({"enabled": "yes"}, r"stability\.tokenizer_fallback\.enabled"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(fields: dict[str, object], match: str) -> None:
    data = preset("tiny").to_dict()
    data["stability"]["tokenizer_fallback"] |= fields
    with pytest.raises(ConfigError, match=match):
        TrainConfig.from_dict(data)


def test_the_mechanism_switches_off_by_name() -> None:
    cfg = preset("tiny")
    assert cfg.stability.tokenizer_fallback.enabled
    disable(cfg.stability, "tokenizer_fallback")
    assert not cfg.stability.tokenizer_fallback.enabled


# -- frequent words kept whole -------------------------------------------------------------


def test_the_default_threshold_scales_with_the_corpus() -> None:
    assert scaled_min_count(10**10) == 10**6  # the design's figure at its scale
    assert scaled_min_count(2_000_000) == 200
    assert scaled_min_count(1000) == 50  # the floor


def test_frequent_words_become_single_tokens_where_the_vocabulary_has_room(
    tokenizer: Tokenizer, texts: list[str]
) -> None:
    counts = count_pieces(texts)
    frequent = [w for w, n in counts.items() if n >= 100 and is_word(w)]
    split = [w for w in frequent if len(tokenizer.model.tokenize(w)) > 1]
    assert split  # a 400-token BPE leaves some of them in pieces
    # 64 free ids (the model's vocabulary is larger than the BPE trained).
    whole, kept = keep_whole(tokenizer, texts, 464, TokenizerConfig(keep_whole_min_count=100))
    assert kept.left_split == () and set(kept.joined) == set(split)
    assert all(len(whole.model.tokenize(w)) == 1 for w in frequent)
    assert tokenizer.get_vocab_size() < whole.get_vocab_size() <= 464
    rare = [w for w, n in counts.items() if n < 5 and is_word(w)]
    assert any(len(whole.model.tokenize(w)) > 1 for w in rare)  # rarer words not necessarily
    assert whole.token_to_id("<|endoftext|>") == 0
    sample = texts[0]
    assert whole.decode(whole.encode(sample).ids) == sample


def test_keeping_words_whole_never_passes_the_vocabulary_size(
    tokenizer: Tokenizer, texts: list[str]
) -> None:
    whole, kept = keep_whole(tokenizer, texts, 400, TokenizerConfig(keep_whole_min_count=60))
    assert whole.get_vocab_size() <= 400
    # Every token it could give back is used more often than the words it would join.
    before = sum(len(e.ids) for e in tokenizer.encode_batch(texts))
    assert sum(len(e.ids) for e in whole.encode_batch(texts)) <= before
    assert kept.left_split  # reported, not hidden


def test_a_threshold_of_zero_changes_nothing(tokenizer: Tokenizer, texts: list[str]) -> None:
    whole, kept = keep_whole(tokenizer, texts, 464, TokenizerConfig(keep_whole_min_count=0))
    assert whole is tokenizer and kept.frequent == ()


def test_a_bad_threshold_is_refused_naming_the_field() -> None:
    data = preset("tiny").to_dict()
    data["data"]["tokenizer"] = {"keep_whole_min_count": -1}
    with pytest.raises(ConfigError, match=r"data\.tokenizer\.keep_whole_min_count"):
        TrainConfig.from_dict(data)


def test_words_are_counted_as_the_tokenizer_splits_them(
    tokenizer: Tokenizer, texts: list[str]
) -> None:
    extra = ["x (y) don't a  b\tc\n\n    d $9.99! __init__ café 12abc\n    (z)"]
    real = Counter(p for t in texts + extra for p, _ in tokenizer.pre_tokenizer.pre_tokenize_str(t))
    assert count_pieces(texts + extra) == real


def test_the_clean_corpus_never_sets_it_off(tokenizer: Tokenizer) -> None:
    corpus = Corpus(DataConfig().source_weights, seed=11)  # documents the BPE never saw
    fallback = _fallback(tokenizer)
    docs = [corpus.document(i) for i in range(400)]
    assert all(ids is not None for ids in fallback.encode(docs, _encoder(tokenizer)))
    counters = fallback.take_counters()
    assert sum(c["docs"] for c in counters.by_source.values()) == 400
    assert not counters.acted() and not fallback_claims(counters)


def test_the_stream_with_stress_and_fallback_resumes_exactly(tokenizer: Tokenizer) -> None:
    spec = TokenizerStressSpec.model_validate({"at_step": 1, "rate": 0.3, "seed": 2})

    def stream() -> TokenStream:
        corpus = Corpus(DataConfig().source_weights, seed=5)
        pipeline = DocumentPipeline(corpus, wrap=lambda docs: StressedStream(spec, docs))
        return TokenStream(
            pipeline, _encoder(tokenizer), TokenLayout(0), 17, fallback=_fallback(tokenizer)
        )

    straight = stream()
    expected = straight.take(40) + straight.take(300)
    assert straight.fallback is not None and straight.fallback.take_counters().acted()
    first = stream()
    head = first.take(40)
    second = stream()
    second.load_state_dict(first.state_dict())
    assert head + second.take(300) == expected


def test_the_byte_alphabet_is_the_tokenizers_own() -> None:
    assert set(byte_decoder()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(byte_decoder().values()) == list(range(256))
