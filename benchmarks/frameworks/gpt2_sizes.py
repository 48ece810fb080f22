"""The GPT-2 sizes the framework scripts train (``--size``), shared by both so that a size
means the same model under Hugging Face's ``Trainer`` and under Lightning's.

- ``tiny``: 2 layers of width 64 over 64 tokens, 256 tokens in all (0.12M parameters; a
  step of batch 8 takes about 14 ms on one CPU thread): a fixed cost per step shows at
  its largest.
- ``small``: 4 layers of width 128 over 128 tokens, 1,024 in all (0.94M parameters; about
  120 ms a step): still far shorter than a step of a model anyone trains, but long enough
  that a step is mostly the model's own arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Size:
    """One model size: GPT-2's own settings, and the sequence length and vocabulary."""

    layers: int
    width: int
    heads: int
    seq: int
    vocab: int

    def config(self) -> dict[str, Any]:
        """``GPT2Config`` keyword arguments (the last token is both BOS and EOS)."""
        return {"n_layer": self.layers, "n_embd": self.width, "n_head": self.heads,
                "vocab_size": self.vocab, "n_positions": self.seq,
                "bos_token_id": self.vocab - 1, "eos_token_id": self.vocab - 1}  # fmt: skip


SIZES = {
    "tiny": Size(layers=2, width=64, heads=2, seq=64, vocab=256),
    "small": Size(layers=4, width=128, heads=4, seq=128, vocab=1024),
}
