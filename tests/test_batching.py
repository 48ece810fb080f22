"""Dynamic batching: pieces of whole documents, packed by length under a token budget,
resumable, the same steps whatever the split over ranks, every real token weighted alike."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from reference_trainer.config import DataConfig, TrainConfig, preset
from reference_trainer.corpus.corpus import Corpus
from reference_trainer.errors import ConfigError
from reference_trainer.model.gpt import GPT, GPTConfig, next_token_loss
from reference_trainer.packed_step import packed_forward_backward
from reference_trainer.stability.precision import Precision
from reference_trainer.stream.batching import (
    PackedLoader,
    PackedStep,
    PackedStream,
    cut_pieces,
    masked_targets,
    pack,
    summed_token_loss,
)
from reference_trainer.stream.data import DocumentPipeline, TokenLayout

MAX_LEN = 17  # block_size 16
BUDGET = 4 * MAX_LEN


def encode(texts: list[str]) -> list[list[int]]:
    """A character-level encoding (no tokenizer to train): ids 1..100."""
    return [[1 + ord(c) % 100 for c in text[: 40 + len(text) % 90]] for text in texts]


def stream(sort_pool: int = 8, budget: int = BUDGET) -> PackedStream:
    corpus = Corpus(DataConfig().source_weights, seed=5)
    return PackedStream(
        DocumentPipeline(corpus),
        encode,
        TokenLayout(0),
        max_len=MAX_LEN,
        budget=budget,
        sort_pool=sort_pool,
        seed=9,
    )


def padding_share(batches: list[list[list[int]]]) -> float:
    real = sum(len(p) - 1 for b in batches for p in b)
    padded = sum(len(b) * (max(len(p) for p in b) - 1) for b in batches)
    return (padded - real) / padded


def test_pieces_overlap_by_one_so_every_token_after_the_first_is_a_target_once() -> None:
    for length in (0, 1, 2, 16, 17, 18, 33, 34, 100):
        ids = list(range(length))
        pieces = cut_pieces(ids, MAX_LEN)
        assert all(2 <= len(p) <= MAX_LEN for p in pieces)
        targets = [t for p in pieces for t in p[1:]]
        assert targets == ids[1:]


def test_packing_respects_the_budget_and_places_every_piece_once() -> None:
    lengths = [17, 3, 9, 17, 2, 5, 16, 8, 8, 4, 17, 11, 2, 6]
    pieces = [[1] * n for n in lengths]
    batches = pack(pieces, BUDGET)
    assert sorted(i for b in batches for i in b) == list(range(len(pieces)))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= BUDGET
    # Longest first: the pieces of each micro-batch are no longer than the previous one's.
    firsts = [lengths[b[0]] for b in batches]
    assert firsts == sorted(firsts, reverse=True)


def test_stream_trains_on_every_token_of_the_documents_it_read_exactly_once() -> None:
    s = stream()
    s._fill_pool()  # one pool: the documents read so far, all of them packed
    batches = s.take(len(s._queue))
    read = s.documents.reader.position
    corpus = s.documents.corpus
    expected = [
        p
        for ids in encode([corpus.document(i).text for i in range(read)])
        for p in cut_pieces(TokenLayout(0).wrap(ids), MAX_LEN)
    ]
    assert sorted(p for b in batches for p in b) == sorted(expected)
    for batch in batches:
        assert len(batch) * max(len(p) for p in batch) <= BUDGET


def _in_stream_order(pieces: list[list[int]], budget: int) -> list[list[list[int]]]:
    """Packing without sorting: a micro-batch grows while its padded size fits."""
    batches: list[list[list[int]]] = [[]]
    for piece in pieces:
        batch = batches[-1]
        width = max([len(piece), *(len(p) for p in batch)])
        if batch and (len(batch) + 1) * width > budget:
            batches.append([piece])
        else:
            batch.append(piece)
    return batches


def test_sorting_by_length_keeps_padding_small_where_stream_order_would_not() -> None:
    corpus = Corpus(DataConfig().source_weights, seed=5)
    texts = [corpus.document(i).text for i in range(300)]
    pieces = [p for ids in encode(texts) for p in cut_pieces(TokenLayout(0).wrap(ids), MAX_LEN)]
    by_length = padding_share([[pieces[i] for i in b] for b in pack(pieces, BUDGET)])
    # Negative control: the same pieces in stream order.
    in_order = padding_share(_in_stream_order(pieces, BUDGET))
    assert by_length < 0.05
    assert in_order > 4 * by_length
    # And the stream itself, pool after pool, stays as low.
    assert padding_share(stream(sort_pool=16).take(200)) < 0.05


def test_the_order_is_deterministic_and_resumes_exactly_mid_pool() -> None:
    straight = stream()
    expected = straight.take(7) + straight.take(120)
    assert stream().take(127) == expected
    first = stream()
    head = first.take(7)
    state = first.state_dict()
    second = stream()
    second.load_state_dict(state)
    assert head + second.take(120) == expected


def test_ranks_split_the_same_step_as_accumulation_on_one_rank() -> None:
    one = PackedLoader(stream(), grad_accum=2, rank=0, world_size=1)
    ranks = [PackedLoader(stream(), grad_accum=1, rank=r, world_size=2) for r in range(2)]
    for _ in range(5):
        single = one.next_step()
        shards = [loader.next_step() for loader in ranks]
        assert single.targets == shards[0].targets == shards[1].targets
        assert single.pad_tokens == shards[0].pad_tokens
        rows = [
            tuple(s.tokens[i, : int(s.lengths[i])].tolist())
            for s in shards
            for i in range(len(s.lengths))
        ]
        assert rows == [
            tuple(single.tokens[i, : int(single.lengths[i])].tolist())
            for i in range(len(single.lengths))
        ]
        assert sum(s.local_targets for s in shards) == single.targets


# -- the loss ----------------------------------------------------------------------------


def model() -> GPT:
    """A small model whose token losses differ widely (large embeddings, tied head), so
    that how tokens are weighted shows in the loss."""
    torch.manual_seed(0)
    net = GPT(GPTConfig(vocab_size=101, block_size=16, n_layer=1, n_head=2, n_embd=16))
    with torch.no_grad():
        net.wte.weight.mul_(50.0)
    return net


def test_a_padded_batch_loss_is_the_unpadded_mean_over_real_tokens() -> None:
    net = model().eval()
    pieces = [list(range(1, 18)), list(range(5, 12)), [7, 8, 9]]
    packed = PackedLoader(_fixed_stream([pieces]), grad_accum=1, rank=0, world_size=1).next_step()
    width = int(packed.lengths.max())
    y = masked_targets(packed.tokens, packed.lengths, width)
    padded = summed_token_loss(net(packed.tokens[:, : width - 1]), y) / packed.targets
    per_row = [
        next_token_loss(net(torch.tensor([p[:-1]])), torch.tensor([p[1:]])) * (len(p) - 1)
        for p in pieces
    ]
    assert packed.targets == 16 + 6 + 2
    assert packed.pad_tokens == 3 * 16 - 24
    torch.testing.assert_close(padded, sum(per_row) / packed.targets, rtol=1e-6, atol=1e-6)


class _ListStream(PackedStream):
    """Hands out given micro-batches (to test the step's weighting on known rows)."""

    def __init__(self, batches: list[list[list[int]]]) -> None:
        self._given = list(batches)

    def take(self, count: int) -> list[list[list[int]]]:
        out, self._given = self._given[:count], self._given[count:]
        return out


def _fixed_stream(batches: list[list[list[int]]]) -> PackedStream:
    return _ListStream(batches)


def _trainer(net: GPT, world_size: int) -> Any:
    return SimpleNamespace(
        topo=SimpleNamespace(device=torch.device("cpu"), world_size=world_size),
        agent=SimpleNamespace(batch=lambda tokens: tokens),
        wrapped=net,
        precision=Precision("fp32", "cpu"),
        scaler=SimpleNamespace(scale_loss=lambda loss: loss),
    )


#: Micro-batches of very different real-token counts: 32, 4 and 2 + 1 targets.
_MICRO = [
    [list(range(1, 18)), list(range(20, 37))],
    [[3, 4, 5], [6, 7, 8]],
    [[9, 10, 11], [12, 13]],
]


def _reference_grads(micro: list[list[list[int]]]) -> tuple[float, list[torch.Tensor]]:
    """Gradient of the mean loss over every real token of the step, row by row, unpadded."""
    net = model()
    pieces = [p for batch in micro for p in batch]
    total = sum(
        next_token_loss(net(torch.tensor([p[:-1]])), torch.tensor([p[1:]])) * (len(p) - 1)
        for p in pieces
    )
    mean = total / sum(len(p) - 1 for p in pieces)
    mean.backward()
    return float(mean.detach()), [p.grad.clone() for p in net.parameters() if p.grad is not None]


def _packed_grads(world_size: int, accum: int) -> tuple[float, list[torch.Tensor]]:
    """Each simulated rank's passes, then the average over ranks that data-parallel
    training makes of gradients (and the step's agreement of losses)."""
    grads: list[torch.Tensor] = []
    loss = 0.0
    for rank in range(world_size):
        net = model()
        loader = PackedLoader(
            _fixed_stream(_MICRO), grad_accum=accum, rank=rank, world_size=world_size
        )
        passes = packed_forward_backward(_trainer(net, world_size), loader.next_step())
        loss += float(passes.local) / world_size
        mine = [p.grad for p in net.parameters() if p.grad is not None]
        grads = mine if not grads else [g + m for g, m in zip(grads, mine, strict=True)]
    return loss, [g / world_size for g in grads]


@pytest.mark.parametrize(("world_size", "accum"), [(1, 3), (3, 1)])
def test_every_real_token_weighs_the_same_over_micro_steps_and_ranks(
    world_size: int, accum: int
) -> None:
    want_loss, want = _reference_grads(_MICRO)
    loss, got = _packed_grads(world_size, accum)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_a_mean_of_micro_batch_means_would_not_weigh_tokens_alike() -> None:
    """Negative control for the test above: equal weights per micro-batch (right for fixed
    windows, where every micro-batch holds as many tokens) miss the token mean here."""
    want_loss, want = _reference_grads(_MICRO)
    each = [_reference_grads([batch]) for batch in _MICRO]
    loss = sum(mean for mean, _ in each) / len(each)
    grads = [sum(g) / len(each) for g in zip(*(grads for _, grads in each), strict=True)]
    assert loss != pytest.approx(want_loss, rel=1e-3)
    with pytest.raises(AssertionError):
        for g, w in zip(grads, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_packed_step_is_this_ranks_share() -> None:
    loader = PackedLoader(_fixed_stream(_MICRO), grad_accum=1, rank=1, world_size=3)
    step: PackedStep = loader.next_step()
    assert step.micro_rows == (2,)
    assert step.local_targets == 4
    assert step.targets == 32 + 4 + 3
    assert loader.tokens_per_step() == 39


# -- configuration -----------------------------------------------------------------------


def _with_batching(**batching: object) -> TrainConfig:
    data = preset("tiny").to_dict()
    data["data"]["batching"] = {"enabled": True, **batching}
    return TrainConfig.from_dict(data)


@pytest.mark.parametrize(
    ("batching", "message"),
    [
        ({"tokens_per_batch": 64}, r"data\.batching\.tokens_per_batch must be at least .*\(65\)"),
        ({"tokens_per_batch": -1}, r"data\.batching\.tokens_per_batch must be an integer >= 0"),
        ({"sort_pool": 0}, r"data\.batching\.sort_pool must be a positive integer"),
        ({"enabled": "yes"}, r"data\.batching\.enabled must be true or false"),
        ({"budget": 5}, r"config\.data\.batching has unknown field\(s\): budget"),
    ],
)
def test_bad_batching_config_is_refused_naming_the_field(
    batching: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _with_batching(**batching)


def test_the_default_budget_is_the_fixed_batch() -> None:
    cfg = _with_batching()
    assert cfg.data.batching.budget(cfg.batch_size, cfg.model.block_size) == 8 * 65
    assert _with_batching(tokens_per_batch=1000).data.batching.budget(8, 64) == 1000


def test_enable_dynamic_batching_switches_the_data_config_not_stability() -> None:
    cfg = preset("tiny")
    stability = repr(cfg.stability)
    cfg.enable("dynamic_batching")
    assert cfg.data.batching.enabled
    assert repr(cfg.stability) == stability
