"""Rebalancing a straggler (`reference_trainer.stability.straggler_shares`, opt-in): the
shares, the loader's uneven slices of the same global batch, the loss weights under which
DDP's average of the ranks' gradients is still the global batch's gradient, and the
mechanism setting the shares when a rank is flagged and putting them back when it recovers.
"""

from __future__ import annotations

import pytest
import torch

from harness.records.events import Recovered
from reference_trainer.config import DataConfig
from reference_trainer.corpus.corpus import Corpus
from reference_trainer.model.gpt import GPT, GPTConfig, next_token_loss
from reference_trainer.stability.mechanism import StepState
from reference_trainer.stability.mechanisms import StabilityConfig
from reference_trainer.stability.straggler_shares import rebalanced, shares
from reference_trainer.stability.straggler_step import StragglerWatch
from reference_trainer.stability.stragglers import StragglerConfig
from reference_trainer.stream.data import DocumentPipeline, ShardedLoader, TokenLayout, TokenStream

WINDOW = 9


def stream() -> TokenStream:
    """The corpus's documents as bytes: a real stream, no tokenizer to train."""

    def encode(texts: list[str]) -> list[list[int]]:
        return [list(t.encode()[:200]) for t in texts]

    return TokenStream(DocumentPipeline(Corpus(DataConfig().source_weights, seed=5)), encode,
                       TokenLayout(0), WINDOW)  # fmt: skip


def loaders(world: int = 2, batch_size: int = 8, accum: int = 2) -> list[ShardedLoader]:
    return [
        ShardedLoader(stream(), batch_size=batch_size, grad_accum=accum, rank=r, world_size=world)
        for r in range(world)
    ]


def test_shares_follow_speed_sum_to_the_batch_and_leave_everyone_one() -> None:
    assert shares(16, [1.0, 1.0]) == [8, 8]
    assert shares(16, [1.0, 1 / 3]) == [12, 4]  # a rank 3x as slow: a quarter
    assert shares(16, [1.0, 0.5, 1.0]) == [6, 4, 6]
    assert shares(4, [1.0, 0.001]) == [3, 1]  # never nothing
    assert sum(shares(17, [0.9, 0.7, 0.3])) == 17
    assert rebalanced(8, [1.0, 0.25], set()) is None
    assert rebalanced(8, [1.0, 0.25], {1}) == [12, 4]  # (13.2 and 2.8, rounded up to 1 more)
    with pytest.raises(ValueError, match="at least 1 each"):
        shares(1, [1.0, 1.0])
    with pytest.raises(ValueError, match="speeds must be > 0"):
        shares(4, [1.0, 0.0])


def test_uneven_slices_cover_the_same_global_batch_once() -> None:
    even, uneven = loaders(), loaders()
    for loader in uneven:
        loader.shares = [11, 5]
    for _ in range(3):
        whole = torch.cat([loader.next_step().reshape(-1, WINDOW) for loader in even])
        parts = [loader.next_step() for loader in uneven]
        assert [p.shape for p in parts] == [(2, 11, WINDOW), (2, 5, WINDOW)]
        assert torch.equal(torch.cat([p.reshape(-1, WINDOW) for p in parts]), whole)
    assert [loader.loss_weight() for loader in uneven] == [11 / 8, 5 / 8]
    assert [loader.loss_weight() for loader in even] == [1.0, 1.0]


def test_weighted_losses_average_to_the_global_batch_gradient() -> None:
    """DDP averages the ranks' gradients; with each rank's mean loss times its weight, the
    average is the gradient of the mean loss over the global batch, as with even shares."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, block_size=WINDOW - 1, n_layer=1, n_head=2, n_embd=16))
    even, uneven = loaders(accum=1), loaders(accum=1)
    for loader in uneven:
        loader.shares = [13, 3]

    def averaged(group: list[ShardedLoader], weighted: bool = True) -> list[torch.Tensor]:
        grads = []
        for loader in group:
            batch = loader.next_step()[0]
            model.zero_grad()
            loss = next_token_loss(model(batch[:, :-1]), batch[:, 1:])
            (loss * loader.loss_weight() if weighted else loss).backward()
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        return [sum(g) / len(group) for g in zip(*grads, strict=True)]

    reference = averaged(even)
    for a, b in zip(reference, averaged(uneven), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    unweighted = loaders(accum=1)  # negative control: the same uneven shares, no weights
    for loader in unweighted:
        loader.shares = [13, 3]
    wrong = averaged(unweighted, weighted=False)
    assert any(not torch.allclose(a, b, rtol=1e-3) for a, b in zip(reference, wrong, strict=True))


def test_a_flagged_rank_gets_a_smaller_share_until_it_recovers() -> None:
    cfg = StragglerConfig(rebalance=True, patience=3, after_save=0)
    [loader0, loader1] = loaders()
    watches = [StragglerWatch(cfg, r, 2, loader) for r, loader in enumerate((loader0, loader1))]
    claims: list[tuple[int, object]] = []

    def step(n: int, times: list[float]) -> None:
        for watch in watches:
            s = StepState(n, 1e-3)
            watch.agreed(s, torch.tensor(times))
            claims.extend((n, c) for c in s.claims if isinstance(c, Recovered))

    for n in range(1, 4):  # rank 1 3x slow: flagged at the third step
        step(n, [0.1, 0.3])
    assert loader0.shares == loader1.shares == [12, 4]
    [(at, first)] = claims
    assert at == 3 and first.action == "straggler_rebalanced"
    assert first.details["slow_ranks"] == [1] and first.details["shares"] == [12, 4]
    # (The times handed in are per sequence: still 3x slow, its share stays, no new claim.)
    step(4, [0.1, 0.3])
    assert loader1.shares == [12, 4] and len(claims) == 1
    step(5, [0.1, 0.1])  # back to speed: even shares again
    assert loader0.shares is None and loader1.shares is None
    assert claims[-1][1].details["shares"] == [8, 8] and claims[-1][1].details["slow_ranks"] == []


def test_rebalancing_is_opt_in_and_needs_the_straggler_scores() -> None:
    assert StragglerConfig().rebalance is False
    on = StabilityConfig()
    on.enable("straggler_rebalance")
    assert on.stragglers.rebalance
    off = StabilityConfig()
    off.stragglers.enabled = False
    off.enable("straggler_rebalance")
    assert not off.stragglers.rebalance
    watch = StragglerWatch(StragglerConfig(), 0, 2, loaders()[0])
    assert watch.loader is None  # not asked for: never touches the loader
