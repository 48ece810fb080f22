"""The microscope's forward hooks on a trainer's modules, made so that they leave no trace.

Like the agent's own hooks (harness/inside/hooks.py), an `OutputHook` copies
(``copy.deepcopy``) and pickles as `Inert`: a trainer's EMA copy records nothing and a
pickle holds no recorder. While a save of the trainer's is watched (an attached agent
listens to ``torch.save``), `SavesWithoutOutputHooks` takes them off the modules saved,
so the file holds nothing of tightrope and loads where tightrope is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from harness.inside import files
from harness.inside.hooks import Inert


class OutputHook:
    """A forward hook that hands a module's output to ``see`` with the layer's index."""

    def __init__(self, see: Callable[[int, Any], None], index: int) -> None:
        self.see, self.index = see, index

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        self.see(self.index, output)

    def __deepcopy__(self, memo: dict[int, Any]) -> Inert:
        return Inert()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Inert, ())


def strip_output_hooks(obj: object) -> Callable[[], None]:
    """Take every `OutputHook` (and inert copies of one) off the modules in ``obj`` (a
    module, or a dict, list or tuple holding modules); returns what puts them back, in
    their order."""
    roots: list[object] = [obj]
    if isinstance(obj, dict):
        roots = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        roots = list(obj)
    taken: list[tuple[dict[int, Any], list[tuple[int, Any]]]] = []
    for root in roots:
        if not isinstance(root, nn.Module):
            continue
        for module in root.modules():
            hooks = module._forward_hooks
            if any(isinstance(h, (OutputHook, Inert)) for h in hooks.values()):
                taken.append((hooks, list(hooks.items())))
                for key, hook in list(hooks.items()):
                    if isinstance(hook, (OutputHook, Inert)):
                        del hooks[key]

    def restore() -> None:
        # Whole, in the old order: a trainer's own hooks may depend on running first.
        for hooks, items in taken:
            hooks.clear()
            hooks.update(items)

    return restore


def saves_watched() -> bool:
    """True while an agent listens to the trainer's saves (attached, or ``tightrope exec``).
    The reference trainer's are not: it saves state dicts, and a listener would cost it a
    hash of every file it writes."""
    return bool(files._listeners)


class SavesWithoutOutputHooks:
    """A file listener (harness/inside/files.py) that takes the output hooks off what a
    save pickles, for the length of the save."""

    def before_save(self, obj: object) -> Callable[[], None]:
        """A save of ``obj`` begins: its modules lose their output hooks until it ends."""
        return strip_output_hooks(obj)

    def saved(self, path: Path, sha256: str, size: int, api: str) -> None:
        """Nothing to do."""

    def loaded(self, path: Path, sha256: str, api: str) -> None:
        """Nothing to do."""

    def load_failed(self, path: Path, sha256: str | None, error: BaseException, api: str) -> None:
        """Nothing to do."""
