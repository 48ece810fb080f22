"""Dynamic batching against fixed windows: tokens/s and the padding share, per preset.

Each row trains the preset through the real command line (``python -m reference_trainer``,
fp32, 1 rank, ``OMP_NUM_THREADS=1``, no checkpoint before the last step) in a fresh
temporary run dir, with fixed windows or with ``--enable dynamic_batching`` (the default
budget: batch_size x (block_size + 1) tokens per micro-step). It reads the step events back
from the journal and leaves out the first warm-up steps.

- ``tokens/s``: real tokens per step (the step event's ``tokens``: the targets the loss
  counts, averaged over the measured steps) over the median ``step_time`` (a median, as
  benchmarks/trainer_throughput.py takes: other work on the machine stretches some steps).
- ``real tokens/step``: below the fixed windows' count where micro-batches pad or do not
  fill their budget (a pool's last, shortest pieces; rows x a long piece short of it).
- ``pad``: padded positions over all positions computed, sum(pad_tokens) /
  (sum(tokens) + sum(pad_tokens)); fixed windows pad nothing.
- ``x fixed``: tokens/s over the fixed-window row of the same preset, measured in the same
  command; with ``--repeat N`` the modes alternate and each row is the median of N runs.

``--interleaved`` measures in this process, one thread, what a step of each mode costs
the model alone: loader, forward and backward, fixed and dynamic alternating step by step
on the same weights (no optimizer step), so that other work on the machine slows both
alike; ``tokens/s`` is again real tokens per step over the median.

``--pools`` measures the stream alone (no training): padding share and fill (real tokens
per micro-batch over the fixed windows' batch_size x block_size) for several
``data.batching.sort_pool`` values, over the first 400 micro-batches of each preset's corpus.

Absolute speeds depend on the machine and on whatever else runs on it; read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.records.journal import read_journal

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path("benchmarks/results/batching.json")
#: (preset, steps, warm-up steps left out): about 2 minutes a repeat on a 2-core CPU.
PRESETS = (("tiny", 40, 3), ("small", 12, 2))
MODES = ("fixed", "dynamic")


@dataclass(slots=True)
class Row:
    """One preset and batching mode, and what its runs measured."""

    preset: str
    mode: str
    runs: int = 0
    tokens_per_s: float = 0.0
    tokens_per_step: float = 0.0
    pad_share: float = 0.0
    ms_per_step: float = 0.0
    x_fixed: float | None = None


def run_once(preset: str, mode: str, steps: int, warmup: int) -> tuple[float, float, float, float]:
    """Train once; (tokens/s, real tokens per step, padding share, median ms/step)."""
    with tempfile.TemporaryDirectory(prefix="tightrope-batching-") as tmp:
        run_dir = Path(tmp) / "run"
        argv = [sys.executable, "-m", "reference_trainer", "--preset", preset]
        argv += ["--steps", str(steps), "--run-dir", str(run_dir), "--log-every", str(steps)]
        argv += ["--checkpoint-every", str(steps + 1), "--device", "cpu"]
        if mode == "dynamic":
            argv += ["--enable", "dynamic_batching"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{preset} {mode}: exit code {done.returncode}\n{done.stderr[-2000:]}")
        events = [e for e in read_journal(run_dir).of_kind("step") if e.step > warmup]
    tokens = sum(e["tokens"] for e in events)
    pad = sum(e.fields.get("pad_tokens", 0) for e in events)
    median = statistics.median(e["step_time"] for e in events)
    per_step = tokens / len(events)
    return per_step / median, per_step, pad / (tokens + pad), median * 1e3


def measure(repeat: int, presets: tuple[tuple[str, int, int], ...]) -> list[Row]:
    """Every preset in both modes, alternating, ``repeat`` times; medians per row."""
    rows: list[Row] = []
    for preset, steps, warmup in presets:
        samples: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in MODES}
        for _ in range(repeat):
            for mode in MODES:
                samples[mode].append(run_once(preset, mode, steps, warmup))
                print(f"{preset} {mode}: {samples[mode][-1][0]:,.0f} tokens/s", flush=True)
        for mode in MODES:
            got = samples[mode]
            rows.append(
                Row(
                    preset,
                    mode,
                    len(got),
                    statistics.median(s[0] for s in got),
                    statistics.median(s[1] for s in got),
                    statistics.median(s[2] for s in got),
                    statistics.median(s[3] for s in got),
                )
            )
        fixed, dynamic = rows[-2], rows[-1]
        fixed.x_fixed, dynamic.x_fixed = 1.0, dynamic.tokens_per_s / fixed.tokens_per_s
    return rows


def pools(presets: tuple[tuple[str, int, int], ...], sizes: tuple[int, ...]) -> str:
    """Padding share and fill of the stream alone for each ``sort_pool`` in ``sizes``."""
    from reference_trainer.config import preset as load_preset
    from reference_trainer.corpus.corpus import Corpus
    from reference_trainer.stream.batching import PackedStream
    from reference_trainer.stream.data import DocumentPipeline, TokenLayout
    from reference_trainer.tokenizer.bpe import train_tokenizer

    lines = ["| preset | sort_pool | pad | fill |", "|---|---:|---:|---:|"]
    for name, _, _ in presets:
        cfg = load_preset(name)
        corpus = Corpus(cfg.data.source_weights, cfg.data.seed)
        texts = (corpus.document(i).text for i in range(cfg.data.tokenizer_docs))
        tokenizer = train_tokenizer(texts, cfg.model.vocab_size)

        def encode(batch: list[str], tok: object = tokenizer) -> list[list[int]]:
            out = tok.encode_batch(batch, add_special_tokens=False)  # type: ignore[attr-defined]
            return [e.ids for e in out]

        budget = cfg.batch_size * (cfg.model.block_size + 1)
        for size in sizes:
            stream = PackedStream(
                DocumentPipeline(corpus),
                encode,
                TokenLayout.from_config(cfg.data, eot_id=0),
                max_len=cfg.model.block_size + 1,
                budget=budget,
                sort_pool=size,
                seed=cfg.data.seed,
            )
            batches = stream.take(400)
            real = sum(len(p) - 1 for b in batches for p in b)
            padded = sum(len(b) * (len(b[0]) - 1) for b in batches)
            fill = real / (len(batches) * cfg.batch_size * cfg.model.block_size)
            lines.append(f"| {name} | {size} | {(padded - real) / padded:.1%} | {fill:.1%} |")
    return "\n".join(lines)


def interleaved(presets: tuple[tuple[str, int, int], ...], steps: dict[str, int]) -> str:
    """Loader + forward + backward of both modes, alternating step by step, per preset."""
    import contextlib
    import time
    from types import SimpleNamespace

    import torch

    from reference_trainer.config import preset as load_preset
    from reference_trainer.corpus.corpus import Corpus
    from reference_trainer.model.gpt import GPT, next_token_loss
    from reference_trainer.packed_step import packed_forward_backward
    from reference_trainer.stream.batching import PackedLoader, PackedStream
    from reference_trainer.stream.data import (
        DocumentPipeline,
        ShardedLoader,
        TokenLayout,
        TokenStream,
    )
    from reference_trainer.tokenizer.bpe import train_tokenizer

    torch.set_num_threads(1)
    lines = [
        "| preset | steps | fixed ms/step | dynamic ms/step | real tokens/step | x fixed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, _, _ in presets:
        cfg = load_preset(name)
        corpus = Corpus(cfg.data.source_weights, cfg.data.seed)
        texts = (corpus.document(i).text for i in range(cfg.data.tokenizer_docs))
        tokenizer = train_tokenizer(texts, cfg.model.vocab_size)

        def encode(batch: list[str], tok: object = tokenizer) -> list[list[int]]:
            out = tok.encode_batch(batch, add_special_tokens=False)  # type: ignore[attr-defined]
            return [e.ids for e in out]

        layout, window = TokenLayout.from_config(cfg.data, eot_id=0), cfg.model.block_size + 1
        fixed = ShardedLoader(
            TokenStream(DocumentPipeline(corpus), encode, layout, window),
            batch_size=cfg.batch_size,
            grad_accum=1,
            rank=0,
            world_size=1,
        )
        budget = cfg.data.batching.budget(cfg.batch_size, cfg.model.block_size)
        packed = PackedStream(
            DocumentPipeline(corpus),
            encode,
            layout,
            max_len=window,
            budget=budget,
            sort_pool=cfg.data.batching.sort_pool,
            seed=cfg.data.seed,
        )
        dynamic = PackedLoader(packed, grad_accum=1, rank=0, world_size=1)
        torch.manual_seed(cfg.seed)
        model = GPT(cfg.model)
        trainer = SimpleNamespace(
            topo=SimpleNamespace(device=torch.device("cpu"), world_size=1),
            agent=SimpleNamespace(batch=lambda tokens: tokens),
            wrapped=model,
            precision=SimpleNamespace(autocast=contextlib.nullcontext),
            scaler=SimpleNamespace(scale_loss=lambda loss: loss),
        )
        fixed_s, dynamic_s, real = [], [], []
        for _ in range(steps[name]):
            t0 = time.perf_counter()
            batch = fixed.next_step()[0]
            next_token_loss(model(batch[:, :-1]), batch[:, 1:]).backward()
            fixed_s.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            step = dynamic.next_step()
            packed_forward_backward(trainer, step)  # type: ignore[arg-type]
            dynamic_s.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
            real.append(step.targets)
        f, d = statistics.median(fixed_s), statistics.median(dynamic_s)
        per_step = statistics.mean(real)
        ratio = (per_step / d) / (cfg.batch_size * cfg.model.block_size / f)
        lines.append(
            f"| {name} | {len(fixed_s)} | {f * 1e3:,.1f} | {d * 1e3:,.1f} | {per_step:,.1f} "
            f"| {ratio:.3f} |"
        )
    return "\n".join(lines)


def markdown(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| preset | batching | runs | tokens/s | x fixed | real tokens/step | pad | ms/step |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.preset} | {r.mode} | {r.runs} | {r.tokens_per_s:,.0f} | {r.x_fixed:.3f} | "
            f"{r.tokens_per_step:,.1f} | {r.pad_share:.1%} | {r.ms_per_step:,.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1, help="runs per row, modes alternating")
    p.add_argument("--quick", action="store_true", help="tiny only")
    p.add_argument("--interleaved", action="store_true", help="model cost, steps alternating")
    p.add_argument("--pools", action="store_true", help="the stream alone, per sort_pool")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    args = p.parse_args(argv)
    presets = PRESETS[:1] if args.quick else PRESETS
    if args.interleaved:
        print(interleaved(presets, {"tiny": 300, "small": 40}))
        return 0
    if args.pools:
        print(pools(presets, (1, 4, 16, 64)))
        return 0
    rows = measure(max(1, args.repeat), presets)
    print(markdown(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
