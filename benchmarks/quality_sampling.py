"""Quality-weighted sampling with and without, on the default and the llama data mix.

Each mix trains the tiny preset in this process (fp32, 1 rank) per seed: with
`quality_sampling` off and on with its defaults, and for the first seed also on with
``power 0`` (the control: the weights stay at base, so the documents are those of the run
without, and the per-source losses are still measured). Per run: final training loss
(mean of the last 10 steps; not comparable between runs whose mixes differ), median step
time, the weights and quality scores at the last step (`data_weights` events), and the
final model's loss on held-out documents of each source of the mix (64 documents each,
at corpus indices from 10**7 on, which no run reaches), with their mean weighted by the
mix's base weights: the figure that says whether the run got better at the mix it was
asked to learn.

With ``--noisy SOURCE`` that source's documents are random letter strings (a source the
model cannot learn, for the whole process and the held-out sets alike) and the "mix"
figure leaves it out: what the chosen direction, less weight to a source whose loss
stays high, is for.

    .venv/bin/python benchmarks/quality_sampling.py [--steps 200] [--seeds 0 1] [--out FILE]
    .venv/bin/python benchmarks/quality_sampling.py --mixes llama --noisy encyclopedia
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import reference_trainer.corpus.corpus as corpus_module  # noqa: E402
from harness.records.journal import read_journal  # noqa: E402
from reference_trainer.config import TrainConfig, preset  # noqa: E402
from reference_trainer.corpus.corpus import SOURCE_NAMES, generate_text  # noqa: E402
from reference_trainer.corpus.mixes import DATA_MIXES, mix_weights  # noqa: E402
from reference_trainer.corpus.templates import between  # noqa: E402
from reference_trainer.model.gpt import GPT, next_token_loss  # noqa: E402
from reference_trainer.stream.data import TokenLayout  # noqa: E402
from reference_trainer.tokenizer.bpe import load_tokenizer  # noqa: E402
from reference_trainer.train import train  # noqa: E402
from tests.test_trainer import final_state  # noqa: E402

RUNS = {"off": None, "on": 2.0, "power 0": 0.0}
HELD_OUT, HELD_OUT_DOCS = 10**7, 64
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def noise(rng: random.Random) -> str:
    """A document of random letter strings: nothing in it can be learned."""
    count = between(rng, 80, 300)
    return " ".join("".join(rng.choices(LETTERS, k=between(rng, 2, 9))) for _ in range(count))


def make_noisy(source: str) -> None:
    """Every document of ``source`` becomes noise (the corpus looks its generators up per
    document, so replacing the table is enough)."""
    table = dict(corpus_module._GENERATORS)
    table[source] = noise
    corpus_module._GENERATORS = MappingProxyType(table)  # type: ignore[assignment]


def held_out_loss(cfg: TrainConfig, folder: Path) -> dict[str, float]:
    """The final model's mean next-token loss on held-out documents of each source."""
    model = GPT(cfg.model)
    model.load_state_dict(final_state(folder)["model"])
    model.eval()
    tokenizer = load_tokenizer(folder, cfg.model.vocab_size)
    layout = TokenLayout.from_config(cfg.data, eot_id=0)
    window = cfg.model.block_size + 1
    out = {}
    for source in cfg.data.source_weights:
        texts = [generate_text(source, cfg.data.seed, HELD_OUT + i) for i in range(HELD_OUT_DOCS)]
        ids = [
            t
            for e in tokenizer.encode_batch(texts, add_special_tokens=False)
            for t in layout.wrap(e.ids)
        ]
        rows = torch.tensor(ids[: len(ids) // window * window]).view(-1, window)
        with torch.no_grad():
            out[source] = float(next_token_loss(model(rows[:, :-1]), rows[:, 1:]))
    return out


def measure(
    folder: Path, mix: str, steps: int, power: float | None, seed: int, noisy: str | None
) -> dict[str, Any]:
    """One run and what its journal says."""
    cfg = preset("tiny")
    cfg.steps, cfg.checkpoint_every, cfg.seed = steps, steps, seed
    cfg.data.source_weights = mix_weights(mix)
    q = cfg.stability.quality_sampling
    q.enabled, q.journal_every = power is not None, 1
    if power is not None:
        q.power = power
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg, folder)
    journal = read_journal(folder)
    steps_seen = list(journal.of_kind("step"))
    events = {e.step: e.fields for e in journal.of_kind("data_weights")}
    marks = [m for m in (steps // 4, steps // 2, 3 * steps // 4, steps) if m in events]
    held = held_out_loss(cfg, folder)
    base = {s: w for s, w in mix_weights(mix).items() if s != noisy}
    return {
        "final_loss": statistics.fmean(e["loss"] for e in steps_seen[-10:]),
        "median_ms": 1e3 * statistics.median(e["step_time"] for e in steps_seen[3:]),
        "losses": [e["loss"] for e in steps_seen],
        "weights": {m: events[m]["weights"] for m in marks},
        "quality": events[steps]["quality"] if steps in events else None,
        "held_out": held,
        "held_out_mix": sum(base[s] * held[s] for s in base) / sum(base.values()),
    }


def main() -> int:
    """Run, print, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument(
        "--mixes", nargs="+", choices=sorted(DATA_MIXES), default=["default", "llama"]
    )
    parser.add_argument("--noisy", choices=SOURCE_NAMES, help="this source's documents are noise")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/quality.json")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.noisy is not None:
        make_noisy(args.noisy)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mix in args.mixes:
            for seed in args.seeds:
                for name, power in RUNS.items():
                    if name == "power 0" and seed != args.seeds[0]:
                        continue
                    key = f"{mix} / {name} / seed {seed}"
                    folder = Path(tmp) / key.replace(" / ", "-").replace(" ", "")
                    results[key] = measure(folder, mix, args.steps, power, seed, args.noisy)
    console = Console()
    noisy = f", {args.noisy} is noise" if args.noisy else ""
    table = Table(title=f"quality_sampling, tiny, {args.steps} steps{noisy}")
    columns = ("run", "train loss", "ms/step", "weights (last step)", "quality", "held-out", "mix")
    for column in columns:
        table.add_column(column)
    for key, r in results.items():
        last = r["weights"].get(args.steps) if r["weights"] else None
        fmt = lambda d: " ".join(f"{k[:4]} {v:.3f}" for k, v in d.items()) if d else "-"  # noqa: E731
        table.add_row(
            key,
            f"{r['final_loss']:.4f}",
            f"{r['median_ms']:.1f}",
            fmt(last),
            fmt(r["quality"]),
            fmt(r["held_out"]),
            f"{r['held_out_mix']:.4f}",
        )
    console.print(table)
    for mix in args.mixes:
        first = args.seeds[0]
        off, control = (results[f"{mix} / {n} / seed {first}"] for n in ("off", "power 0"))
        same = off["losses"] == control["losses"]
        console.print(f"{mix}: power 0 trains on the same documents as off (losses equal): {same}")
        for name in ("off", "on"):
            mixes = [
                results[f"{mix} / {name} / seed {seed}"]["held_out_mix"] for seed in args.seeds
            ]
            console.print(
                f"{mix} / {name}: held-out loss at the base mix, per seed: "
                + ", ".join(f"{m:.4f}" for m in mixes)
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta = {"when": stamp, "steps": args.steps, "noisy": args.noisy}
    args.out.write_text(json.dumps({**meta, "runs": results}, indent=1))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
