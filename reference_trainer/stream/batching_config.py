"""Settings of dynamic batching (`data.batching`): whole documents grouped by length under
a token budget per rank micro-step, instead of fixed windows cut across documents
(docs/data.md). Off by default: it changes what every step trains on."""

from __future__ import annotations

from dataclasses import dataclass

from reference_trainer.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class BatchingConfig:
    """Dynamic batching: ``enabled=False`` keeps today's fixed windows."""

    enabled: bool = False
    """Batches of whole documents (pieces of at most block_size + 1 tokens) under a token
    budget, padded positions ignored by the loss (``--enable dynamic_batching``)."""
    tokens_per_batch: int = 0
    """Token budget of one rank micro-step, padding included (rows x longest piece);
    0: batch_size x (block_size + 1), the fixed batch's size."""
    sort_pool: int = 64
    """Micro-batches' worth of documents gathered, sorted by length and cut into
    micro-batches at once: more sorts better (less padding), fewer keeps the data order
    closer to the stream's (a piece waits at most one pool)."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"data.batching.enabled must be true or false, got {self.enabled!r}")
        tokens = self.tokens_per_batch
        if not (isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0):
            raise ConfigError(
                f"data.batching.tokens_per_batch must be an integer >= 0 (0: the fixed "
                f"batch's size), got {tokens!r}"
            )
        pool = self.sort_pool
        if not (isinstance(pool, int) and not isinstance(pool, bool) and pool > 0):
            raise ConfigError(f"data.batching.sort_pool must be a positive integer, got {pool!r}")

    def budget(self, batch_size: int, block_size: int) -> int:
        """Tokens per rank micro-step: the configured budget, or the fixed batch's size."""
        return self.tokens_per_batch or batch_size * (block_size + 1)

    def check_fits(self, block_size: int) -> None:
        """A budget must hold at least one full piece (block_size + 1 tokens)."""
        if self.tokens_per_batch and self.tokens_per_batch < block_size + 1:
            raise ConfigError(
                f"data.batching.tokens_per_batch must be at least model.block_size + 1 "
                f"({block_size + 1}) so that a full piece fits, got {self.tokens_per_batch}"
            )
