"""torch, imported on first use.

A fault plan is read and checked (``tightrope exec``, ``tightrope faults``, suite files)
without torch: its import takes about a second, and the command that trains imports it
anyway. Injectors reach torch through these names, which load it at their first
attribute access (or are torch itself when it is loaded already).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


class LazyModule:
    """Stands for a module until an attribute of it is asked for."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


def lazy(name: str) -> Any:
    """The module ``name`` when it is imported already, else a `LazyModule` for it."""
    return sys.modules.get(name) or LazyModule(name)


torch: Any = lazy("torch")
nn: Any = lazy("torch.nn")
