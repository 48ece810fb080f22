"""The training stream: documents -> tokens with the special-token layout -> fixed windows,
handed out per rank per step. Its position is a few integers, saved with every checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reference_trainer.config import DataConfig
from reference_trainer.corpus import Corpus

#: Documents tokenized together; larger batches tokenize faster, the buffer grows with it.
_ENCODE_BATCH = 16


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """Where `<|endoftext|>` goes: before, inside (every N tokens) and after a document."""

    eot_id: int
    at_start: int = 1
    every: int = 1024
    at_end: int = 2

    @classmethod
    def from_config(cls, cfg: DataConfig, eot_id: int) -> TokenLayout:
        """The layout a data configuration asks for."""
        return cls(eot_id, cfg.eot_at_start, cfg.eot_every, cfg.eot_at_end)

    def wrap(self, body: Sequence[int]) -> list[int]:
        """A document's token ids with the layout's `<|endoftext|>` tokens in place."""
        out = [self.eot_id] * self.at_start
        every = self.every or len(body) or 1
        for start in range(0, len(body), every):
            if start:
                out.append(self.eot_id)
            out.extend(body[start : start + every])
        out.extend([self.eot_id] * self.at_end)
        return out


Encoder = Callable[[list[str]], list[list[int]]]


class TokenStream:
    """Endless windows of ``window`` tokens cut, back to back, from the documents in order."""

    def __init__(self, corpus: Corpus, encode: Encoder, layout: TokenLayout, window: int) -> None:
        self.corpus = corpus
        self.encode = encode
        self.layout = layout
        self.window = window
        self.next_doc = 0
        self.windows_taken = 0
        self._buffer: list[int] = []

    def _refill(self) -> None:
        texts = [self.corpus.document(self.next_doc + i).text for i in range(_ENCODE_BATCH)]
        for ids in self.encode(texts):
            self._buffer.extend(self.layout.wrap(ids))
        self.next_doc += _ENCODE_BATCH

    def take(self, count: int) -> list[list[int]]:
        """The next ``count`` windows."""
        need = count * self.window
        while len(self._buffer) < need:
            self._refill()
        out = [self._buffer[i * self.window : (i + 1) * self.window] for i in range(count)]
        del self._buffer[:need]
        self.windows_taken += count
        return out

    def state_dict(self) -> dict[str, Any]:
        """Position in the stream: enough to continue exactly where it stopped."""
        return {
            "next_doc": self.next_doc,
            "windows_taken": self.windows_taken,
            "buffer": torch.tensor(self._buffer, dtype=torch.int64),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by `state_dict`."""
        self.next_doc = int(state["next_doc"])
        self.windows_taken = int(state["windows_taken"])
        self._buffer = [int(t) for t in state["buffer"].tolist()]


class ShardedLoader:
    """Each optimizer step takes the next global batch of windows from the stream; a rank
    keeps its contiguous share, split into micro-batches.

    The window order does not depend on the number of ranks, so world size W with
    accumulation A sees the same global batch as world size 1 with accumulation W*A.
    """

    def __init__(
        self, stream: TokenStream, *, batch_size: int, grad_accum: int, rank: int, world_size: int
    ) -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.rank = rank
        self.world_size = world_size

    def next_step(self) -> torch.Tensor:
        """This rank's windows for one step: int64 (grad_accum, batch_size, window)."""
        per_rank = self.batch_size * self.grad_accum
        windows = self.stream.take(per_rank * self.world_size)
        mine = windows[self.rank * per_rank : (self.rank + 1) * per_rank]
        return torch.tensor(mine, dtype=torch.int64).view(
            self.grad_accum, self.batch_size, self.stream.window
        )

    def tokens_per_step(self) -> int:
        """Tokens trained on per step over all ranks (inputs, not counting the shift)."""
        return (self.stream.window - 1) * self.batch_size * self.grad_accum * self.world_size
