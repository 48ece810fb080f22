"""Named data mixes: the share of documents each corpus source gets, by name
(``--data-mix NAME``). `default` is the built-in mix every preset starts from."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DATA_MIXES: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "default": MappingProxyType(
            {"technical_docs": 0.4, "social_chatter": 0.2, "product_reviews": 0.2, "code": 0.2}
        ),
        # The mix the design names after a well-known pre-training recipe: mostly web text,
        # an encyclopedia share and code.
        "llama": MappingProxyType({"web": 0.60, "encyclopedia": 0.15, "code": 0.25}),
    }
)


def mix_weights(name: str) -> dict[str, float]:
    """A fresh copy of the source weights of the mix called ``name``."""
    try:
        return dict(DATA_MIXES[name])
    except KeyError:
        raise ValueError(
            f"unknown data mix {name!r}; expected one of {', '.join(DATA_MIXES)}"
        ) from None
