"""``tightrope exec``'s bootstrap: attach the agent right after the program imports torch.

Python imports ``sitecustomize`` at start-up from the first folder on ``sys.path`` that
holds one; ``tightrope exec`` puts this folder first on PYTHONPATH. Nothing is imported
here beyond the standard library: a meta path finder waits for ``import torch`` and calls
`harness.inside.exec_runtime.bootstrap` once torch has loaded, so a process that never imports torch
(torchrun's helpers, a shell-out to Python) pays nothing. The ``sitecustomize`` this one
shadows, if any, still runs. Under ``tightrope crashpoints`` it also arms the crash-point
hook (`harness.inside.crash_hook`) at once.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).resolve().parent


def _attach() -> None:
    try:
        from harness.inside.exec_runtime import bootstrap
    except ImportError:  # tightrope is not installed where this interpreter looks
        sys.path.append(str(_HERE.parents[2]))  # the project: harness/inside/_bootstrap
        from harness.inside.exec_runtime import bootstrap
    bootstrap()


class _AfterTorch(MetaPathFinder):
    """Finds nothing itself; wraps torch's loader so `_attach` runs once torch is loaded."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            _attach()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _shadowed() -> None:
    """Run the ``sitecustomize`` later on the path, which this one hides."""
    rest = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _crash_hook() -> None:
    """``tightrope crashpoints``: count this process's file events (and die at the point)."""
    try:
        from harness.inside.crash_hook import arm_from_env
    except ImportError:
        sys.path.append(str(_HERE.parents[2]))
        from harness.inside.crash_hook import arm_from_env
    arm_from_env()


def arm() -> None:
    """Attach the agent and arm the crash-point hook as the environment says; at start-up,
    and in each child of ``tightrope crashpoints``' zygote (`harness.inside.zygote`),
    which has imported torch already."""
    if os.environ.get("TIGHTROPE_RUN_DIR"):
        if "torch" in sys.modules:
            _attach()
        else:
            sys.meta_path.insert(0, _AfterTorch())
    if os.environ.get("TIGHTROPE_CRASH_LOG"):
        # After the agent's finder: the hook's writers wrap the agent's, which still hash
        # what was saved whole before a torn point cuts it.
        _crash_hook()


arm()
_shadowed()
