"""One walk over nested training state (dicts, lists, tuples), used wherever a state's
leaves of one type must be replaced: copying tensors to CPU, numpy <-> torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def map_leaves(obj: Any, leaf: type | tuple[type, ...], fn: Callable[[Any], Any]) -> Any:
    """A copy of ``obj`` with every ``leaf``-typed value replaced by ``fn(value)``; dicts,
    lists and tuples are rebuilt, everything else is kept as it is."""
    if isinstance(obj, leaf):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_leaves(v, leaf, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_leaves(v, leaf, fn) for v in obj)
    return obj
