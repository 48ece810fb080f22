"""Running the reference trainer in-process with a fault plan, for the stability tests."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path
from typing import Any

from faults import FaultPlan
from harness.records.journal import Journal, read_journal
from reference_trainer.config import TrainConfig, preset
from reference_trainer.stability.registry import disable as switch_off
from reference_trainer.stability.registry import fragile as all_off
from reference_trainer.train import RunResult, train


def config(
    *, steps: int = 30, disable: tuple[str, ...] = (), fragile: bool = False, **fields: Any
) -> TrainConfig:
    """The tiny preset, checkpoints every 10 steps, with mechanisms switched off as asked."""
    data = preset("tiny").to_dict() | {"steps": steps, "checkpoint_every": 10} | fields
    cfg = TrainConfig.from_dict(data)
    if fragile:
        cfg.stability = all_off()
    for name in disable:
        switch_off(cfg.stability, name)
    return cfg


def run(
    run_dir: Path, cfg: TrainConfig, faults: list[dict[str, Any]] | None = None, **kwargs: Any
) -> tuple[RunResult, Journal]:
    """Train in this process (progress lines silenced) and read the journal back."""
    plan = FaultPlan.from_dict({"faults": faults or []})
    with contextlib.redirect_stdout(io.StringIO()):
        result = train(cfg, run_dir, plan=plan, **kwargs)
    return result, read_journal(run_dir)


def claims(journal: Journal, kind: str, name: str | None = None) -> list[Any]:
    """Claims of one kind (detected/recovered), optionally of one detector or action."""
    key = "detector" if kind == "detected" else "action"
    return [e for e in journal.of_kind(kind) if name is None or e.get(key) == name]


def final_loss(journal: Journal, last: int = 5) -> float:
    """Mean loss of the last steps (the surviving attempt of each)."""
    losses = journal.losses()
    return sum(losses[-last:]) / last


def finite_at_end(journal: Journal) -> bool:
    """The agent's last parameter check found every parameter finite."""
    checks = [e["params_finite"] for e in journal.of_kind("step") if "params_finite" in e.fields]
    return bool(checks) and bool(checks[-1])


def near(a: float, b: float, rel: float) -> bool:
    """Both finite and within ``rel`` of each other."""
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rel * abs(b)
