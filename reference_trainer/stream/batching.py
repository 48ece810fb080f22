"""Dynamic batching: whole documents cut into pieces of at most block_size + 1 tokens,
grouped by length so that padding is small, as many per micro-batch as a token budget
holds (docs/data.md).

A pool of documents (``sort_pool`` micro-batches' worth of tokens, read in stream order)
is cut into pieces, sorted by length (longest first, stream order among equals) and cut
greedily into micro-batches whose rows x longest piece stays within the budget; the pool's
micro-batches are then shuffled by a generator seeded with (data seed, pool number), so
that steps do not go from long pieces to short ones. Every step takes the next
grad_accum x world_size micro-batches and a rank keeps its contiguous share: the sequence
of micro-batches depends neither on the world size nor on the accumulation, so world size
W with accumulation A trains on what world size 1 with accumulation W x A trains on. The
pending micro-batches are saved with every checkpoint: a resume continues bit-exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from reference_trainer.stream.data import (
    DocumentPipeline,
    Encoder,
    TokenLayout,
    encode_next,
)
from reference_trainer.tokenizer.fallback import TokenFallback

#: Documents tokenized together (as the fixed-window stream does).
#: Target id of a padded position: cross-entropy ignores it.
IGNORE_INDEX = -100
#: Input id of a padded position (`<|endoftext|>`); its prediction is ignored anyway.
PAD_ID = 0

Piece = list[int]
MicroBatch = list[Piece]


def cut_pieces(ids: Sequence[int], max_len: int) -> list[Piece]:
    """A document's tokens as pieces of at most ``max_len`` tokens that overlap by one, so
    every token after the first is a target exactly once; a lone token has no target."""
    stride = max_len - 1
    return [list(ids[s : s + max_len]) for s in range(0, max(len(ids) - 1, 0), stride)]


def pack(pieces: Sequence[Piece], budget: int) -> list[list[int]]:
    """Indices of ``pieces`` grouped into micro-batches, longest first: a micro-batch grows
    while (rows + 1) x its longest piece stays within ``budget`` tokens."""
    order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i]))  # stable: ties in order
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * len(pieces[batches[-1][0]]) <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class PackedStream:
    """Endless micro-batches of whole-document pieces under a token budget."""

    def __init__(
        self,
        documents: DocumentPipeline,
        encode: Encoder,
        layout: TokenLayout,
        *,
        max_len: int,
        budget: int,
        sort_pool: int,
        seed: int,
        fallback: TokenFallback | None = None,
    ) -> None:
        if budget < max_len:
            raise ValueError(f"a budget of {budget} tokens cannot hold a piece of {max_len}")
        self.documents = documents
        self.encode = encode
        self.layout = layout
        self.max_len = max_len
        self.budget = budget
        self.sort_pool = sort_pool
        self.seed = seed
        self.fallback = fallback
        self.pools = 0
        self.taken = 0
        self._queue: list[MicroBatch] = []

    def _fill_pool(self) -> None:
        """Read documents until the pool holds ``sort_pool`` budgets of tokens, then queue
        its micro-batches in a seeded order."""
        pieces: list[Piece] = []
        tokens = 0
        while tokens < self.sort_pool * self.budget:
            for _, ids in encode_next(self.documents, self.encode, self.fallback):
                for piece in cut_pieces(self.layout.wrap(ids), self.max_len):
                    pieces.append(piece)
                    tokens += len(piece)
        batches = pack(pieces, self.budget)
        rng = np.random.default_rng([self.seed, self.pools])
        self._queue.extend([[pieces[i] for i in batches[j]] for j in rng.permutation(len(batches))])
        self.pools += 1

    def take(self, count: int) -> list[MicroBatch]:
        """The next ``count`` micro-batches (each a list of pieces, longest first)."""
        while len(self._queue) < count:
            self._fill_pool()
        out, self._queue = self._queue[:count], self._queue[count:]
        self.taken += count
        return out

    def skip(self, count: int) -> None:
        """Pass over ``count`` micro-batches without training on them."""
        self.take(count)

    def state_dict(self) -> dict[str, Any]:
        """Position in the stream plus the pending micro-batches, as flat tensors."""
        pieces = [piece for batch in self._queue for piece in batch]
        return {
            "documents": self.documents.state_dict(),
            "pools": self.pools,
            "taken": self.taken,
            "tokens": torch.tensor([t for p in pieces for t in p], dtype=torch.int64),
            "lengths": torch.tensor([len(p) for p in pieces], dtype=torch.int64),
            "rows": torch.tensor([len(b) for b in self._queue], dtype=torch.int64),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by `state_dict`."""
        if "rows" not in state:
            raise ValueError(
                "the checkpoint's data state is of fixed windows; data.batching must match it"
            )
        self.documents.load_state_dict(state["documents"])
        self.pools = int(state["pools"])
        self.taken = int(state["taken"])
        flat = [int(t) for t in state["tokens"].tolist()]
        pieces: list[Piece] = []
        start = 0
        for length in state["lengths"].tolist():
            pieces.append(flat[start : start + int(length)])
            start += int(length)
        self._queue = []
        start = 0
        for rows in state["rows"].tolist():
            self._queue.append(pieces[start : start + int(rows)])
            start += int(rows)


@dataclass(frozen=True, slots=True)
class PackedStep:
    """One rank's share of a step: its micro-batches' rows, padded to one width."""

    #: int64 (rows, width): every micro-batch's pieces one after the other, padded.
    tokens: torch.Tensor
    #: int64 (rows,): the real length of each row.
    lengths: torch.Tensor
    #: Rows of each of this rank's micro-batches, in order.
    micro_rows: tuple[int, ...]
    #: Targets (real tokens after the shift) of the whole step, over all ranks.
    targets: int
    #: Padded target positions of the whole step, over all ranks (each micro-batch padded
    #: to its own longest piece).
    pad_tokens: int

    @property
    def local_targets(self) -> int:
        """Targets of this rank's share."""
        return int((self.lengths - 1).sum())


def _padded(pieces: Sequence[Piece]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in pieces)
    tokens = torch.full((len(pieces), width), PAD_ID, dtype=torch.int64)
    for row, piece in enumerate(pieces):
        tokens[row, : len(piece)] = torch.tensor(piece, dtype=torch.int64)
    return tokens, torch.tensor([len(p) for p in pieces], dtype=torch.int64)


class PackedLoader:
    """Each optimizer step takes the next grad_accum x world_size micro-batches; a rank
    keeps its contiguous share (so the step's micro-batches do not depend on the split)."""

    def __init__(
        self, stream: PackedStream, *, grad_accum: int, rank: int, world_size: int
    ) -> None:
        self.stream = stream
        self.grad_accum = grad_accum
        self.rank = rank
        self.world_size = world_size
        self._last = 0

    def next_step(self) -> PackedStep:
        """This rank's micro-batches of the next step, and the step's global counts."""
        batches = self.stream.take(self.grad_accum * self.world_size)
        real = sum(len(p) - 1 for batch in batches for p in batch)
        padded = sum(len(batch) * (len(batch[0]) - 1) for batch in batches)
        mine = batches[self.rank * self.grad_accum : (self.rank + 1) * self.grad_accum]
        tokens, lengths = _padded([p for batch in mine for p in batch])
        self._last = real
        return PackedStep(tokens, lengths, tuple(len(b) for b in mine), real, padded - real)

    def tokens_per_step(self) -> int:
        """Targets the last step trained on, over all ranks."""
        return self._last


def summed_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropies over the positions not marked `IGNORE_INDEX`, in
    fp32 whatever the autocast dtype."""
    return F.cross_entropy(
        logits.float().view(-1, logits.size(-1)),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def masked_targets(tokens: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Targets of rows ``tokens`` cut to ``width`` tokens: positions past each row's real
    length are `IGNORE_INDEX`."""
    targets = tokens[:, 1:width].clone()
    positions = torch.arange(width - 1, device=tokens.device)
    targets[positions[None, :] >= (lengths[:, None] - 1)] = IGNORE_INDEX
    return targets
