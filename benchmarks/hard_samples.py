"""Hard-sample weighting against uniform weighting, on held-out loss, with a clean source
mix and with one source made noise.

Each run trains the tiny preset in this process (fp32, 1 rank) per seed on the default mix,
with `hard_sample_weighting` off (the baseline: uniform weights) and on in the settings
of ``VARIANTS``. Per run: final training loss (mean of the last 10 steps; on the weighted
runs still the unweighted loss), the largest sample weight and the outliers counted (from
`step` events), and the final model's loss on held-out documents of each source (64 each,
at corpus indices from 10**7 on, which no run reaches: `benchmarks/quality_sampling.py`'s
measure), with their mean weighted by the mix's base weights over the clean sources (the
figure that says whether the run got better at what it can learn).

With ``--noisy SOURCE`` that source's documents are random letter strings for the whole
process (`quality_sampling.make_noisy`): the hardest samples are then the ones nothing can
be learned from, which is what weighting by loss up-weights unless its bounds or its
outlier cut hold them down.

    .venv/bin/python benchmarks/hard_samples.py [--steps 200] [--seeds 0 1] [--noisy social_chatter]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.quality_sampling import held_out_loss, make_noisy  # noqa: E402
from harness.records.journal import read_journal  # noqa: E402
from reference_trainer.config import preset  # noqa: E402
from reference_trainer.corpus.corpus import SOURCE_NAMES  # noqa: E402
from reference_trainer.corpus.mixes import mix_weights  # noqa: E402
from reference_trainer.train import train  # noqa: E402

#: Name -> the `stability.hard_samples` fields of the run (None: off, the baseline).
VARIANTS: dict[str, dict[str, float] | None] = {
    "uniform": None,
    "on": {},
    "on, outliers > 1.2x": {"outlier_factor": 1.2},
}


def measure(
    folder: Path, steps: int, fields: dict[str, float] | None, seed: int, noisy: str | None
) -> dict[str, Any]:
    """One run and what its journal and its final model say."""
    cfg = preset("tiny")
    cfg.steps, cfg.checkpoint_every, cfg.seed = steps, steps, seed
    cfg.data.source_weights = mix_weights("default")
    h = cfg.stability.hard_samples
    h.enabled = fields is not None
    for name, value in (fields or {}).items():
        setattr(h, name, value)
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg, folder)
    steps_seen = list(read_journal(folder).of_kind("step"))
    held = held_out_loss(cfg, folder)
    base = {s: w for s, w in mix_weights("default").items() if s != noisy}
    weights = [e["sample_weight_max"] for e in steps_seen if "sample_weight_max" in e.fields]
    return {
        "final_loss": statistics.fmean(e["loss"] for e in steps_seen[-10:]),
        "median_ms": 1e3 * statistics.median(e["step_time"] for e in steps_seen[3:]),
        "max_weight": max(weights) if weights else None,
        "excluded": sum(int(e.fields.get("samples_excluded", 0)) for e in steps_seen),
        "held_out": held,
        "held_out_clean": sum(base[s] * held[s] for s in base) / sum(base.values()),
    }


def main() -> int:
    """Run, print, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--noisy", choices=SOURCE_NAMES, help="this source's documents are noise")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = args.out or ROOT / f"benchmarks/results/hard_samples-{args.noisy or 'clean'}.json"
    if args.noisy is not None:
        make_noisy(args.noisy)
    results: dict[str, dict[str, Any]] = {}
    if out.exists():  # a stopped run goes on where it stopped
        results = json.loads(out.read_text()).get("runs", {})
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name in args.variants:
                key = f"{name} / seed {seed}"
                if key in results:
                    continue
                folder = Path(tmp) / f"{len(results)}"
                results[key] = measure(folder, args.steps, VARIANTS[name], seed, args.noisy)
                _write(out, args, results)
    _print(results, args)
    return 0


def _write(out: Path, args: argparse.Namespace, results: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta = {"when": stamp, "steps": args.steps, "noisy": args.noisy}
    out.write_text(json.dumps({**meta, "runs": results}, indent=1))


def _print(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    console = Console(width=160)
    noisy = f", {args.noisy} is noise" if args.noisy else ", clean sources"
    table = Table(title=f"hard_sample_weighting, tiny, default mix, {args.steps} steps{noisy}")
    for column in (
        "run",
        "train loss",
        "max weight",
        "outliers",
        "held-out",
        "clean mix",
        "x uniform",
    ):
        table.add_column(column)
    for key, r in results.items():
        seed = key.split(" / ")[1]
        base = results.get(f"uniform / {seed}")
        ratio = r["held_out_clean"] / base["held_out_clean"] if base else float("nan")
        held = " ".join(f"{k[:4]} {v:.3f}" for k, v in r["held_out"].items())
        mw = "-" if r["max_weight"] is None else f"{r['max_weight']:.2f}"
        table.add_row(
            key, f"{r['final_loss']:.4f}", mw, str(r["excluded"]), held,
            f"{r['held_out_clean']:.4f}", f"{ratio:.4f}",
        )  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    raise SystemExit(main())
