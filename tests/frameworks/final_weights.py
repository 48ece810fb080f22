"""The final weights of a framework trainer, written where a crash-point comparison can read them.

A crash-point run (``tightrope crashpoints``, ``ckpt-chaos run --result-file``) kills a job in
the middle of a save, resumes it with the framework's own resume, and compares the weights the
resumed job ends with against those of an uninterrupted run. Each trainer of this folder takes
``--final-weights PATH`` and writes its model's parameters there at the end, as safetensors: a
format read back without unpickling anything, whose bytes depend only on the tensors (names
sorted, no timestamp), so two runs that ended with the same weights wrote the same bytes and a
hash of the file is a fair comparison.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def save_final_weights(state: dict[str, torch.Tensor], path: str | Path) -> None:
    """Write ``state`` (a model's ``state_dict``) to ``path`` as safetensors.

    Each tensor is copied to the CPU on its own (tied weights, as GPT-2's embedding and head,
    share storage, which safetensors refuses); the folder is made if missing.
    """
    tensors = {name: t.detach().to("cpu").clone().contiguous() for name, t in state.items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))


def read_final_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors a trainer wrote with :func:`save_final_weights`."""
    return load_file(str(path))


def same_weights(a: str | Path, b: str | Path) -> bool:
    """True when the two files hold the same tensor names with bit-identical values."""
    left, right = read_final_weights(a), read_final_weights(b)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)
