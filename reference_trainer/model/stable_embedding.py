"""The stable token embedding that 8-bit optimizers want: a layer norm after the lookup and
xavier-uniform initialization (the semantics of bitsandbytes' ``StableEmbedding``; the third
part, 32-bit optimizer state for its weight, is the optimizer's: `adamw8bit`).

Written here rather than imported so that a model with it builds, loads and samples without
bitsandbytes, and so that no process-wide override registry is touched.
"""

from __future__ import annotations

import torch
from torch import nn

#: Optimizers for which ``model.stable_embedding`` left unset means on.
STABLE_BY_DEFAULT = ("adamw8bit",)


class StableEmbedding(nn.Embedding):
    """A token embedding normalized after the lookup, so that the rows a rare token updates
    in large, coarsely quantized steps cannot blow up the residual stream's scale."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.norm = nn.LayerNorm(embedding_dim)

    def reset_parameters(self) -> None:
        """Xavier-uniform rows (called by ``nn.Embedding.__init__``)."""
        nn.init.xavier_uniform_(self.weight)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Normalized embeddings (B, T, C) of token ids (B, T)."""
        out: torch.Tensor = self.norm(super().forward(idx))
        return out


def wants_stable_embedding(setting: bool | None, optimizer: str) -> bool:
    """``model.stable_embedding`` as given, or, unset, whether ``optimizer`` asks for it."""
    return setting if setting is not None else optimizer in STABLE_BY_DEFAULT
