"""What 8-bit AdamW saves: optimizer-state bytes of ``adamw8bit`` against the baseline
``adamw`` on the ``tiny`` and ``small`` models, and the peak RSS of a process training each.

State bytes are counted in this process, for every variant alike: the model of the preset
(with the stable embedding when the variant has it), its optimizer from the trainer's own
``build_optimizer``, ``--steps`` optimizer steps on seeded random tokens, then the sum of the
bytes of every distinct tensor storage in ``optimizer.state`` (the 8-bit code books, one
tensor shared by all parameters, counted once). Parameters and gradients are counted too, so
that "params + grads + state" gives the static share of training memory (activations and
the allocator's slack are not in it). The variant ``adamw8bit-8bit-emb`` turns the
stable embedding off, to show what its 32-bit state costs.

Peak RSS is measured apart: each variant trains the same steps in a fresh child process
(``--child``), which reports its peak resident set (``ru_maxrss``) and its RSS right after
its imports; bitsandbytes' own import is in the latter. On a CPU the peak comes with the
first step's activations, before any optimizer state exists, and the state later fits in
memory those activations freed: peak RSS shows the import's cost, not the state's.

    .venv/bin/python benchmarks/optimizer_memory.py [--presets tiny,small] [--steps 3]
        [--no-rss] [--out benchmarks/results/optimizer_memory.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from reference_trainer.config import TrainConfig, preset
from reference_trainer.model.gpt import GPT, next_token_loss
from reference_trainer.model.optim import build_optimizer

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "adamw"
#: Variant -> (optimizer, model.stable_embedding; None: the optimizer's default).
VARIANTS: dict[str, tuple[str, bool | None]] = {
    "adamw": ("adamw", None),
    "adamw8bit": ("adamw8bit", None),
    "adamw8bit-8bit-emb": ("adamw8bit", False),
}


def _config(preset_name: str, variant: str) -> TrainConfig:
    optimizer, stable = VARIANTS[variant]
    data = preset(preset_name).to_dict()
    data["optim"]["name"] = optimizer
    data["model"]["stable_embedding"] = stable
    return TrainConfig.from_dict(data)


def _train(cfg: TrainConfig, steps: int) -> tuple[GPT, torch.optim.Optimizer]:
    """The preset's model and optimizer after ``steps`` steps on seeded random tokens."""
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model_config())
    opt = build_optimizer(model, cfg.optim)
    gen = torch.Generator().manual_seed(1)
    shape = (cfg.batch_size, cfg.model.block_size + 1)
    for _ in range(steps):
        for group in opt.param_groups:
            group["lr"] = cfg.optim.base_lr
        tokens = torch.randint(0, cfg.model.vocab_size, shape, generator=gen)
        next_token_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()  # type: ignore[no-untyped-call]
        opt.step()
    return model, opt


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def state_bytes(opt: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of the optimizer's state, in total and by kind (8-bit codes, 32-bit tensors)."""
    tensors = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    codes = [t for t in tensors if t.dtype == torch.uint8]
    wide = [t for t in tensors if t.dtype != torch.uint8]
    return {
        "total": _storage_bytes(tensors),
        "8bit_codes": _storage_bytes(codes),
        "32bit": _storage_bytes(wide),
    }


def measure_state(preset_name: str, variant: str, steps: int) -> dict[str, Any]:
    """State, parameter and gradient bytes of one variant, trained in this process."""
    model, opt = _train(_config(preset_name, variant), steps)
    params = list(model.parameters())
    state = state_bytes(opt)
    grads = _storage_bytes([p.grad for p in params if p.grad is not None])
    weights = _storage_bytes([p.detach() for p in params])
    return {
        "preset": preset_name,
        "variant": variant,
        "parameters": sum(p.numel() for p in params),
        "param_bytes": weights,
        "grad_bytes": grads,
        "state_bytes": state["total"],
        "state_8bit_code_bytes": state["8bit_codes"],
        "state_32bit_bytes": state["32bit"],
        "static_bytes": weights + grads + state["total"],
    }


def _rss_now_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def child(preset_name: str, variant: str, steps: int) -> None:
    """(In a fresh process.) Train, then print RSS after imports and peak RSS, in KiB."""
    if VARIANTS[variant][0] == "adamw8bit":
        import bitsandbytes  # noqa: F401  (its import is part of what the variant costs)
    after_import = _rss_now_kb()
    _train(_config(preset_name, variant), steps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"rss_after_import_kb": after_import, "peak_rss_kb": peak}))


def measure_rss(preset_name: str, variant: str, steps: int) -> dict[str, int]:
    """Peak RSS of a fresh process training the variant."""
    cmd = [sys.executable, __file__, "--child", preset_name, variant, "--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"{preset_name} {variant} failed:\n{proc.stderr[-2000:]}")
    out: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps before counting")
    parser.add_argument("--no-rss", action="store_true", help="skip the child processes")
    parser.add_argument("--child", nargs=2, metavar=("PRESET", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/optimizer_memory.json"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.child:
        child(args.child[0], args.child[1], args.steps)
        return 0
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    console = Console(width=120)
    rows = []
    for name in presets:
        for variant in VARIANTS:
            console.print(f"{name}: {variant}")
            row = measure_state(name, variant, args.steps)
            if not args.no_rss:
                row |= measure_rss(name, variant, args.steps)
            rows.append(row)
    base = {r["preset"]: r for r in rows if r["variant"] == BASELINE}
    for row in rows:
        b = base[row["preset"]]
        row["state_vs_adamw"] = row["state_bytes"] / b["state_bytes"]
        row["static_vs_adamw"] = row["static_bytes"] / b["static_bytes"]
        if "peak_rss_kb" in row:
            row["peak_rss_vs_adamw"] = row["peak_rss_kb"] / b["peak_rss_kb"]
    result = {
        "benchmark": "optimizer_memory",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "steps": args.steps,
        "baseline": f"{BASELINE}, same preset, measured by the same command (state bytes in "
        "this process; peak RSS in a fresh child process per variant)",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"optimizer memory after {args.steps} steps (MiB; x adamw)")
    columns = ["preset", "variant", "state", "x adamw", "params+grads+state", "x adamw"]
    if not args.no_rss:
        columns += ["RSS after imports", "peak RSS", "x adamw"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("preset", "variant") else "right")
    for r in rows:
        cells = [r["preset"], r["variant"], _mb(r["state_bytes"]), f"{r['state_vs_adamw']:.3f}",
                 _mb(r["static_bytes"]), f"{r['static_vs_adamw']:.3f}"]  # fmt: skip
        if not args.no_rss:
            cells += [_mb(r["rss_after_import_kb"] * 1024), _mb(r["peak_rss_kb"] * 1024),
                      f"{r['peak_rss_vs_adamw']:.3f}"]  # fmt: skip
        table.add_row(*cells)
    console.print(table)
    console.print(f"baseline: {result['baseline']}; {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
