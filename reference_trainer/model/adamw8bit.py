"""8-bit AdamW (``--optimizer adamw8bit``): bitsandbytes' block-wise quantized moments over
the same parameter groups as AdamW (layered epsilon, weight decay on matrices only).

What stays 32-bit, and why:
- a `StableEmbedding`'s weight (the token embedding, and with it the tied head): its rows
  are updated rarely and by large steps, which an 8-bit code of the block's range rounds
  badly; bitsandbytes' own ``StableEmbedding`` asks for the same;
- every tensor under bitsandbytes' ``min_8bit_size`` (4096 elements: biases and norms),
  where quantizing saves next to nothing.

The state of an 8-bit parameter is ``state1``/``state2`` (uint8 codes of the first and
second moment), ``absmax1``/``absmax2`` (each block's scale, fp32) and ``qmap1``/``qmap2``
(the code books, one tensor shared by all parameters); of a 32-bit one, ``state1``/``state2``
in fp32. ``step`` is a plain int. All of it goes through ``state_dict`` and loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from bitsandbytes.optim.adamw import AdamW8bit as BnbAdamW8bit
from torch import nn

from reference_trainer.model.stable_embedding import StableEmbedding


class AdamW8bit(BnbAdamW8bit):
    """bitsandbytes' AdamW8bit with its 32-bit exceptions held by the optimizer itself
    (bitsandbytes keeps them in a process-wide registry keyed by ``id()``, which would leak
    from one run into the next in a long-lived process such as a test session)."""

    def __init__(
        self, params: Any, *, full_precision: Iterable[torch.Tensor], **kwargs: Any
    ) -> None:
        super().__init__(params, **kwargs)  # type: ignore[no-untyped-call]
        self._full_precision = {id(p) for p in full_precision}

    def get_config(self, gindex: int, pindex: int, group: dict[str, Any]) -> dict[str, Any]:
        """bitsandbytes' per-parameter settings, 32-bit state for the named parameters
        (asked once, when a parameter's state is created)."""
        config: dict[str, Any] = super().get_config(gindex, pindex, group)  # type: ignore[no-untyped-call]
        if id(group["params"][pindex]) in self._full_precision:
            config["optim_bits"] = 32
        return config


def full_precision_params(model: nn.Module) -> list[torch.Tensor]:
    """The parameters whose state stays 32-bit: the weights of stable embeddings."""
    return [m.weight for m in model.modules() if isinstance(m, StableEmbedding)]
