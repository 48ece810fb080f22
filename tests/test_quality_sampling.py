"""Quality-weighted sampling: the rule (a source with a higher loss loses weight, within
bounds), the sampler on real tensors, the source tags of the token stream, and bad
configuration refused by its dotted path."""

from __future__ import annotations

import math
from itertools import islice

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.config import TrainConfig, preset
from reference_trainer.corpus.corpus import SOURCE_NAMES, Corpus
from reference_trainer.corpus.mixes import mix_weights
from reference_trainer.errors import ConfigError
from reference_trainer.stability.quality_sampling import QualitySampler
from reference_trainer.stability.quality_weights import (
    QualitySamplingConfig,
    bounded_weights,
    relative_quality,
    updated_quality,
)
from reference_trainer.stream.data import DocumentPipeline, TokenLayout, TokenStream

LLAMA = mix_weights("llama")
WEB, ENC, CODE = (SOURCE_NAMES.index(s) for s in ("web", "encyclopedia", "code"))


def _totals(losses: dict[int, float], tokens: int = 100) -> torch.Tensor:
    """Reduced per-source sums as the step's collective hands them over."""
    sums, counts = [0.0] * len(SOURCE_NAMES), [0.0] * len(SOURCE_NAMES)
    for i, loss in losses.items():
        sums[i], counts[i] = loss * tokens, float(tokens)
    return torch.tensor(sums + counts)


def test_a_source_with_a_higher_loss_loses_weight_and_stops_at_its_bound() -> None:
    cfg = QualitySamplingConfig(enabled=True, ema=0.2, power=2.0, min_factor=0.5, max_factor=2.0)
    sampler = QualitySampler(cfg, LLAMA, torch.device("cpu"))
    history = []
    for _ in range(60):  # web is predicted twice as badly as the others, step after step
        sampler.end_step(_totals({WEB: 6.0, ENC: 3.0, CODE: 3.0}), good=True)
        history.append(sampler.weights_by_source())
    first, last = history[0], history[-1]
    assert first["web"] < 0.60 and last["web"] < first["web"]  # the documented direction
    assert last["encyclopedia"] > 0.15 and last["code"] > 0.25
    assert math.isclose(last["web"], 0.5 * 0.60)  # held at min_factor x base, no lower
    assert all(0.5 * b - 1e-12 <= last[s] <= 2.0 * b + 1e-12 for s, b in LLAMA.items())
    assert math.isclose(sum(last.values()), 1.0)
    assert sampler.quality[WEB] < 1 < sampler.quality[ENC]


def test_skipped_steps_one_source_steps_and_equal_losses_leave_the_weights() -> None:
    cfg = QualitySamplingConfig(enabled=True, ema=0.5)
    sampler = QualitySampler(cfg, LLAMA, torch.device("cpu"))
    assert not sampler.end_step(_totals({WEB: 9.0, CODE: 1.0}), good=False)  # skipped
    assert not sampler.end_step(_totals({WEB: 9.0}), good=True)  # nothing to compare with
    assert not sampler.end_step(_totals({WEB: 9.0, CODE: 1.0}, tokens=10), good=True)  # few
    sampler.end_step(_totals({WEB: 4.0, ENC: 4.0, CODE: 4.0}), good=True)
    assert sampler.weights_by_source() == pytest.approx(LLAMA)
    # Control: the same losses on a good step with enough tokens do move the weights.
    assert sampler.end_step(_totals({WEB: 9.0, CODE: 1.0}), good=True)
    assert sampler.weights_by_source()["web"] < LLAMA["web"]


def test_per_token_losses_are_summed_by_source_from_real_logits() -> None:
    sampler = QualitySampler(QualitySamplingConfig(enabled=True), LLAMA, torch.device("cpu"))
    vocab, targets = 11, torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    logits = torch.zeros(2, 4, vocab)
    logits[0, :, :] = torch.nn.functional.one_hot(targets[0], vocab) * 5.0  # easy row
    sources = torch.tensor([[WEB, WEB, CODE, -1], [CODE, CODE, CODE, CODE]])
    sampler.observe(logits, targets, sources)
    totals = sampler.local_totals()
    per_token = torch.nn.functional.cross_entropy(
        logits.view(-1, vocab), targets.view(-1), reduction="none"
    ).view(2, 4)
    n = len(SOURCE_NAMES)
    assert totals[WEB] == pytest.approx(float(per_token[0, :2].sum()))
    assert totals[CODE] == pytest.approx(float(per_token[0, 2] + per_token[1].sum()))
    assert totals[n + WEB] == 2 and totals[n + CODE] == 5 and float(totals[n:].sum()) == 7
    assert float(sampler.local_totals().abs().sum()) == 0  # reset for the next step


def test_weights_state_round_trips() -> None:
    cfg = QualitySamplingConfig(enabled=True, ema=0.3)
    a = QualitySampler(cfg, LLAMA, torch.device("cpu"))
    for _ in range(5):
        a.end_step(_totals({WEB: 5.0, ENC: 2.0, CODE: 3.0}), good=True)
    b = QualitySampler(cfg, LLAMA, torch.device("cpu"))
    b.load_state_dict(a.state_dict())
    assert (b.quality, b.weights) == (a.quality, a.weights)
    a.end_step(_totals({WEB: 2.0, ENC: 5.0, CODE: 3.0}), good=True)
    b.end_step(_totals({WEB: 2.0, ENC: 5.0, CODE: 3.0}), good=True)
    assert a.weights == b.weights


_base = st.lists(st.floats(0.01, 10.0), min_size=2, max_size=6)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), base=_base, low=st.floats(0.05, 1.0), high=st.floats(1.0, 20.0))
def test_bounded_weights_sum_to_one_within_bounds_and_follow_the_factors(
    data: st.DataObject, base: list[float], low: float, high: float
) -> None:
    base = [b / sum(base) for b in base]
    factors = data.draw(st.lists(st.floats(1e-3, 1e3), min_size=len(base), max_size=len(base)))
    weights = bounded_weights(base, factors, low, high)
    assert math.isclose(sum(weights), 1.0, rel_tol=1e-9)
    for w, b in zip(weights, base, strict=True):
        assert low * b * (1 - 1e-9) <= w <= high * b * (1 + 1e-9)
    ratios = [w / b for w, b in zip(weights, base, strict=True)]
    for i in range(len(base)):  # a larger factor never gets a smaller share of its base
        for j in range(len(base)):
            if factors[i] > factors[j]:
                assert ratios[i] >= ratios[j] * (1 - 1e-9)


def test_clamping_before_normalizing_would_break_the_bounds() -> None:
    """Negative control for the property above: the naive rule it rules out fails it."""
    base, factors, low, high = [0.6, 0.15, 0.25], [0.01, 100.0, 100.0], 0.5, 2.0
    naive = [b * min(max(f, low), high) for b, f in zip(base, factors, strict=True)]
    naive = [w / sum(naive) for w in naive]
    assert naive[0] < low * base[0]  # web fell below its floor
    exact = bounded_weights(base, factors, low, high)
    assert exact[0] >= low * base[0] * (1 - 1e-12)


def test_relative_quality_and_its_moving_average() -> None:
    relative = relative_quality([60.0, 20.0, 0.0, 5.0], [10.0, 10.0, 0.0, 1.0], min_tokens=5)
    assert relative[0] == pytest.approx((85 / 21) / 6) and relative[1] == pytest.approx(
        (85 / 21) / 2
    )
    assert relative[2] is None and relative[3] is None  # absent, too few tokens
    assert updated_quality([1.0, 1.0, 0.7, 0.9], relative, 0.25)[2:] == [0.7, 0.9]


def test_reweighted_corpus_is_deterministic_and_follows_the_weights() -> None:
    heavy = {"web": 0.3, "encyclopedia": 0.3, "code": 0.4}
    a = Corpus(LLAMA, 7).reweighted(heavy)
    assert list(islice(a.documents(100), 50)) == list(islice(Corpus(heavy, 7).documents(100), 50))
    shares = [d.source for d in islice(a.documents(), 2000)]
    assert abs(shares.count("encyclopedia") / 2000 - 0.3) < 0.04


def _stream(tag: bool) -> TokenStream:
    pipeline = DocumentPipeline(Corpus(LLAMA, 3))
    encode = lambda texts: [[len(w) for w in t.split()] for t in texts]  # noqa: E731
    return TokenStream(pipeline, encode, TokenLayout(eot_id=0), window=33, tag_sources=tag)


def test_source_tags_follow_each_token_and_survive_a_resume() -> None:
    stream = _stream(tag=True)
    windows = stream.take(40)
    tags = stream.last_sources
    assert [len(t) for t in tags] == [33] * 40
    # The first document's tokens carry its source, then the next document's begin.
    first = Corpus(LLAMA, 3).document(0)
    body = 1 + len(first.text.split()) + 2  # with the layout's end-of-text tokens
    assert set(tags[0][:body]) == {SOURCE_NAMES.index(first.source)}
    assert {s for t in tags for s in t} <= {WEB, ENC, CODE}
    state = stream.state_dict()
    resumed = _stream(tag=True)
    resumed.load_state_dict(state)
    assert resumed.take(30) == stream.take(30) and resumed.last_sources == stream.last_sources
    assert _stream(tag=False).take(40) == windows
    assert "sources" not in _stream(tag=False).state_dict()  # default checkpoints unchanged


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("ema", 0.0, "(0, 1]"),
        ("ema", 1.5, "(0, 1]"),
        ("power", -1.0, ">= 0"),
        ("min_factor", 0.0, "(0, 1]"),
        ("min_factor", 1.2, "(0, 1]"),
        ("max_factor", 0.9, ">= 1"),
        ("max_factor", math.inf, ">= 1"),
        ("min_tokens", 0, "positive integer"),
        ("journal_every", "10", "positive integer"),
        ("enabled", "yes", "true or false"),
    ],
)
def test_bad_config_is_refused_naming_the_field(field: str, value: object, expected: str) -> None:
    data = preset("tiny").to_dict()
    data["stability"]["quality_sampling"][field] = value
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_dict(data)
    assert f"stability.quality_sampling.{field}" in str(err.value)
    assert expected in str(err.value)


def test_enable_quality_sampling_switches_it_on_and_the_default_is_off() -> None:
    cfg = preset("tiny")
    assert not cfg.stability.quality_sampling.enabled
    cfg.stability.enable("quality_sampling")
    assert cfg.stability.quality_sampling.enabled
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
