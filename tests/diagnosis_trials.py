"""Seeded trials of the problem-layer diagnosis: a fault aimed at one chosen block of a
4-block tiny model, and whether the first diagnosis after it names that block first.

Used by `tests/test_layer_diagnosis.py` (a few trials) and `benchmarks/diagnosis.py` (the
rate over many); docs/stability.md quotes the latter.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.stability_support import config, run

#: The faults a layer applies to, aimed at block ``{b}``, and the precision they run in.
FAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "nan_grad": ("fp32", {"kind": "nan_grad", "target": "blocks.{b}.*"}),
    "inf_grad": ("fp32", {"kind": "inf_grad", "target": "blocks.{b}.attn.*"}),
    "bitflip_weights": (
        "fp32",
        {
            "kind": "bitflip",
            "tensor": "weights",
            "target": "blocks.{b}.mlp.fc.weight",
            "bit": 30,
            "count": 2,
        },
    ),
    "bitflip_gradients": (
        "fp32",
        {
            "kind": "bitflip",
            "tensor": "gradients",
            "target": "blocks.{b}.attn.qkv.weight",
            "bit": 30,
            "count": 2,
        },
    ),
    "activation_overflow": (
        "fp32",
        {"kind": "activation_overflow", "target": "blocks.{b}.mlp", "factor": 1e4},
    ),
    "activation_overflow_fp16": (
        "fp16",
        {"kind": "activation_overflow", "target": "blocks.{b}.mlp", "factor": 1e5},
    ),
}

BLOCKS = 4
FAULT_STEP = 14


@dataclass(frozen=True, slots=True)
class Trial:
    """One seeded trial and what the diagnosis said."""

    fault: str
    block: int
    seed: int
    named: list[str]
    rule: str
    detectors: list[str]

    @property
    def hit(self) -> bool:
        """The diagnosis named the aimed-at block first."""
        return bool(self.named) and self.named[0] == f"blocks.{self.block}"


def trial(fault: str, block: int, seed: int, disable: tuple[str, ...] = ()) -> Trial:
    """Train 4 blocks for a few steps, hit ``block`` at step 14, read the first diagnosis
    made at or after it."""
    precision, spec = FAULTS[fault]
    aimed = {k: (v.format(b=block) if isinstance(v, str) else v) for k, v in spec.items()}
    aimed |= {"at_step": FAULT_STEP, "seed": seed}
    cfg = config(steps=FAULT_STEP + 3, precision=precision, seed=seed, disable=disable)
    cfg.model.n_layer = BLOCKS
    folder = Path(tempfile.mkdtemp(prefix="diagnosis-trial-"))
    try:
        _, journal = run(folder, cfg, [aimed])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    after = [e for e in journal.of_kind("diagnosed") if e.step >= FAULT_STEP and e.rank == 0]
    if not after:
        return Trial(fault, block, seed, [], "no diagnosis", [])
    first = after[0]
    return Trial(fault, block, seed, list(first["layers"]), first.get("rule", ""),
                 list(first["detectors"]))  # fmt: skip
