"""How well the three loss-spike detectors tell injected spikes from the noise of real
training: precision, recall, false alarms per 1,000 clean steps and detection delay, each
detector replayed offline on labelled loss series of the reference trainer.

Recording: per seed, one fault-free run of ``tiny`` and (for the first ``--seeds``) four
runs with two loss-spike faults each (an ``lr_spike`` and a ``bad_batch``, from small to
large), in this process, with spike detection, recovery and the watchdog off so each
series is the raw one. The series go to a cache (``--cache``) that later calls reuse
while their recipe is the same (``--record`` records afresh). Replay: every detector with
the trainer's own settings, fresh on each series, fed the loss of every step the trainer
did not skip, as the trainer feeds it. Scoring: `benchmarks.spike_scoring` (a spike
counts as detected when a firing falls within ``--window`` steps of its onset).

Level shifts: each clean series again with its losses raised by 2%, 5%, 10% and 25% from
60% of the run on (a lasting rise, not a spike), replayed with the robust z-score's level
check on (the trainer's settings) and off (``level_window=0``, as before the check), scored
within two level windows of the shift's onset; false alarms on the clean series.

    .venv/bin/python benchmarks/spike_detectors.py [--quick] [--seeds 4] [--clean-seeds 8]
        [--steps 200] [--record] [--out benchmarks/results/spike_detectors.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import io
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.spike_scoring import Score, Series, Spike, score  # noqa: E402
from faults import FaultPlan  # noqa: E402
from harness.records.journal import read_journal  # noqa: E402
from reference_trainer.config import TrainConfig, preset  # noqa: E402
from reference_trainer.stability.loss_spikes import SpikeConfig, build_detectors  # noqa: E402
from reference_trainer.stability.mechanisms import StabilityConfig  # noqa: E402
from reference_trainer.stability.registry import disable  # noqa: E402
from reference_trainer.train import train  # noqa: E402

# Each faulted run carries one fault early and one late: a small one beside a large one,
# so that every size is met both on a quiet curve and after another spike.
PAIRS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"kind": "lr_spike", "factor": 10.0}, {"kind": "bad_batch", "fraction": 1.0}),
    ({"kind": "bad_batch", "fraction": 0.125}, {"kind": "lr_spike", "factor": 100.0}),
    ({"kind": "lr_spike", "factor": 30.0}, {"kind": "bad_batch", "fraction": 0.5}),
    ({"kind": "bad_batch", "fraction": 0.25}, {"kind": "lr_spike", "factor": 300.0}),
]
# Firing streams replayed per series; each variant scored is a union of some of them.
STREAMS = ("robust_zscore", "early_max", "forecast above", "forecast below")
VARIANTS: dict[str, tuple[str, ...]] = {
    "robust_zscore": ("robust_zscore",),
    "early_max": ("early_max",),
    "forecast (either side)": ("forecast above", "forecast below"),
    "forecast above": ("forecast above",),
    "forecast below": ("forecast below",),
    "robust_zscore + early_max": ("robust_zscore", "early_max"),
    "robust_zscore + early_max + forecast above": (
        "robust_zscore", "early_max", "forecast above",
    ),
}  # fmt: skip
SIZES = ((0.0, 1.1, "< 1.1x"), (1.1, 1.5, "1.1-1.5x"), (1.5, float("inf"), ">= 1.5x"))
#: Lasting rises put on the clean series, and where (a share of the run).
LEVEL_SHIFTS = (0.02, 0.05, 0.1, 0.25)
LEVEL_AT = 0.6


def label(fault: dict[str, Any]) -> str:
    """A fault's short name, as in the tables: ``lr_spike x30``, ``bad_batch 0.25``."""
    if fault["kind"] == "lr_spike":
        return f"lr_spike x{fault['factor']:g}"
    return f"bad_batch {fault['fraction']:g}"


def onset(fault: dict[str, Any]) -> int:
    """The first step whose loss the fault raises: a bad batch's own; a learning-rate
    spike's next (its update shows in the following loss)."""
    return int(fault["at_step"]) + (1 if fault["kind"] == "lr_spike" else 0)


def recipe(seeds: int, steps: int, clean_seeds: int) -> list[dict[str, Any]]:
    """Every run to record: name, seed, faults (with their steps). Seeds past ``seeds``
    only have a clean run (more clean steps for the false-alarm rate)."""
    early, late = round(steps * 0.35), round(steps * 0.7)
    runs: list[dict[str, Any]] = []
    for seed in range(max(seeds, clean_seeds)):
        runs.append({"name": f"seed{seed}/clean", "seed": seed, "faults": []})
        if seed >= seeds:
            continue
        for first, second in PAIRS:
            faults = [first | {"at_step": early}, second | {"at_step": late}]
            name = f"seed{seed}/{label(first)}+{label(second)}".replace(" ", "_")
            runs.append({"name": name, "seed": seed, "faults": faults})
    return runs


def record_one(run: dict[str, Any], steps: int, work: Path) -> dict[int, float]:
    """Train one run in this process; the loss of every step it did not skip."""
    data = preset("tiny").to_dict() | {
        "steps": steps, "seed": run["seed"], "checkpoint_every": steps, "log_every": steps,
    }  # fmt: skip
    cfg = TrainConfig.from_dict(data)
    for name in ("spikes", "recovery", "watchdog"):
        disable(cfg.stability, name)
    run_dir = Path(tempfile.mkdtemp(dir=work)) / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg, run_dir, device="cpu", plan=FaultPlan.from_dict({"faults": run["faults"]}))
    return {
        s: float(e["loss"]) for s, e in read_journal(run_dir).steps().items() if not e["skipped"]
    }


def record(runs: list[dict[str, Any]], steps: int, console: Console) -> dict[str, dict[int, float]]:
    """Every run's series, by name."""
    out: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, run in enumerate(runs, 1):
            started = time.monotonic()
            out[run["name"]] = record_one(run, steps, Path(tmp))
            console.print(
                f"recorded {i}/{len(runs)} {run['name']} ({time.monotonic() - started:.1f} s)"
            )
    return out


def cached(
    path: Path, key: dict[str, Any], make: Callable[[], dict[str, dict[int, float]]]
) -> tuple[dict[str, dict[int, float]], bool]:
    """The series under ``key`` from the cache at ``path``, else made and cached."""
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            series = {
                n: {int(s): float(x) for s, x in v.items()} for n, v in saved["series"].items()
            }
            return series, True
    series = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "series": series}) + "\n")
    return series, False


def labelled(
    runs: list[dict[str, Any]], losses: dict[str, dict[int, float]], window: int
) -> list[Series]:
    """The series with their spikes; a spike's size is the largest loss in its window over
    the clean run's of the same seed (the runs agree step for step until the fault)."""
    out = []
    for run in runs:
        mine, clean = losses[run["name"]], losses[f"seed{run['seed']}/clean"]
        spikes = []
        for fault in run["faults"]:
            start = onset(fault)
            ratios = [
                mine[s] / clean[s]
                for s in range(start, start + window + 1)
                if s in mine and s in clean
            ]
            spikes.append(Spike(start, label(fault), max(ratios, default=float("nan"))))
        shared = min((s.onset for s in spikes), default=0)
        out.append(Series(run["name"], mine, tuple(spikes), shared))
    return out


def replay(series: Series, config: SpikeConfig) -> dict[str, list[int]]:
    """The steps at which each stream fires on one series, every detector fresh."""
    fired: dict[str, list[int]] = {name: [] for name in STREAMS}
    detectors = build_detectors(config)
    for step in sorted(series.losses):
        for detector in detectors:
            claim = detector.observe(step, series.losses[step])
            if claim is not None:
                stream = claim.detector if claim.side is None else f"{claim.detector} {claim.side}"
                fired.setdefault(stream, []).append(step)
    return fired


def shifted(series: list[Series], steps: int) -> list[Series]:
    """Each clean series with each `LEVEL_SHIFTS` rise from ``LEVEL_AT`` of the run on."""
    at = round(steps * LEVEL_AT)
    out = []
    for clean in (s for s in series if s.clean):
        for rise in LEVEL_SHIFTS:
            losses = {k: v * (1 + rise) if k >= at else v for k, v in clean.losses.items()}
            spike = Spike(at, f"level +{rise:.0%}", 1 + rise)
            out.append(Series(f"{clean.name}+{rise:.0%}", losses, (spike,), at))
    return out


def level_rows(
    series: list[Series], shifts: list[Series], config: SpikeConfig, aftermath: int
) -> list[dict[str, Any]]:
    """The robust z-score with its level check on and off, on the shifted series (recall
    per rise) and the clean ones (false alarms)."""
    window = 2 * config.robust.level_window
    rows = []
    for name, level_window in (("level check on", config.robust.level_window), ("off", 0)):
        robust = dataclasses.replace(config.robust, level_window=level_window)
        one = dataclasses.replace(config, robust=robust, enabled=("robust_zscore",), acting=())
        mine = [*shifts, *(s for s in series if s.clean)]
        fired = {s.name: replay(s, one).get("robust_zscore", []) for s in mine}
        result = row(name, score(fired, mine, window=window, aftermath=aftermath))
        rows.append(result)
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def row(name: str, result: Score) -> dict[str, Any]:
    """One variant's figures, as the JSON keeps them."""
    by_size = {}
    for low, high, title in SIZES:
        hits = [d for s, d in result.spikes if low <= s.size < high]
        by_size[title] = {"labelled": len(hits), "detected": sum(d is not None for d in hits)}
    return {
        "variant": name, "labelled": result.labelled, "detected": result.detected,
        "false_alarms": result.false_alarms, "precision": result.precision,
        "recall": result.recall, "clean_steps": result.clean_steps,
        "false_alarms_per_1000_clean_steps": result.false_alarms_per_1000_clean_steps,
        "median_delay": result.median_delay, "max_delay": max(result.delays, default=None),
        "recall_by_size": by_size,
        "by_fault": {
            label: [d for s, d in result.spikes if s.label == label]
            for label in sorted({s.label for s, _ in result.spikes})
        },
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--clean-seeds", type=int, default=8, help="seeds with a clean run")
    parser.add_argument("--quick", action="store_true", help="2 seeds of 150 steps")
    parser.add_argument("--window", type=int, default=5, help="steps after onset that count")
    parser.add_argument("--aftermath", type=int, default=30, help="steps a rollback replaces")
    parser.add_argument("--record", action="store_true", help="record even when cached")
    parser.add_argument("--cache", type=Path, default=ROOT / "benchmarks/results/spike_series.json")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/spike_detectors.json"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.clean_seeds, args.steps = 2, 2, 150
    if args.seeds < 1 or args.steps < 100:
        parser.error("need --seeds >= 1 and --steps >= 100 (the forecaster warms up for 32)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    console = Console(width=max(Console().width, 150))
    started = time.monotonic()
    runs = recipe(args.seeds, args.steps, args.clean_seeds)
    key = {"preset": "tiny", "steps": args.steps, "runs": runs}
    if args.record and args.cache.exists():
        args.cache.unlink()
    losses, reused = cached(args.cache, key, lambda: record(runs, args.steps, console))
    recorded = time.monotonic()
    series = labelled(runs, losses, args.window)
    config = StabilityConfig().spikes  # the trainer's own settings
    config.enabled, config.acting = tuple(SpikeConfig().enabled), ()
    fired = {one.name: replay(one, config) for one in series}
    replayed = time.monotonic()
    rows = []
    for name, streams in VARIANTS.items():
        firings = {n: [s for stream in streams for s in fired[n].get(stream, [])] for n in fired}
        rows.append(row(name, score(firings, series, window=args.window, aftermath=args.aftermath)))
    shifts = shifted(series, args.steps)
    levels = level_rows(series, shifts, StabilityConfig().spikes, args.aftermath)
    result = {
        "benchmark": "spike_detectors",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "command": " ".join(["benchmarks/spike_detectors.py", *(argv or sys.argv[1:])]),
        "preset": "tiny", "seeds": args.seeds, "clean_seeds": max(args.seeds, args.clean_seeds),
        "steps": args.steps,
        "window": args.window, "aftermath": args.aftermath,
        "series": len(series), "clean_series": sum(s.clean for s in series),
        "record_seconds": None if reused else recorded - started,
        "replay_seconds": replayed - recorded, "rows": rows, "level_shifts": levels,
        "spikes": [
            {"series": s.name, "onset": p.onset, "fault": p.label, "size": p.size}
            for s in series for p in s.spikes
        ],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"loss-spike detectors, tiny, {args.seeds} seeds x {args.steps} steps")
    columns = ("variant", "precision", "recall", "false alarms", "per 1k clean", "delay")
    for title in (*columns, *(f"recall {t}" for _, _, t in SIZES)):
        table.add_column(title, justify="left" if title == "variant" else "right")
    for r in rows:
        sizes = [f"{v['detected']}/{v['labelled']}" for v in r["recall_by_size"].values()]
        table.add_row(
            r["variant"], _fmt(r["precision"], ".2f"), f"{r['detected']}/{r['labelled']}",
            str(r["false_alarms"]), _fmt(r["false_alarms_per_1000_clean_steps"], ".1f"),
            f"{_fmt(r['median_delay'], '.0f')} (max {_fmt(r['max_delay'], '.0f')})", *sizes,
        )  # fmt: skip
    console.print(table)
    levels_table = Table(title="robust_zscore on lasting rises (clean series raised from 60% on)")
    for title in ("level check", *(f"+{r:.0%}" for r in LEVEL_SHIFTS), "delay", "per 1k clean"):
        levels_table.add_column(title, justify="left" if title == "level check" else "right")
    for r in levels:
        found = [r["by_fault"].get(f"level +{x:.0%}", []) for x in LEVEL_SHIFTS]
        levels_table.add_row(
            r["variant"], *(f"{sum(d is not None for d in f)}/{len(f)}" for f in found),
            f"{_fmt(r['median_delay'], '.0f')} (max {_fmt(r['max_delay'], '.0f')})",
            _fmt(r["false_alarms_per_1000_clean_steps"], ".1f"),
        )  # fmt: skip
    console.print(levels_table)
    how = "cached series" if reused else f"recorded in {recorded - started:.0f} s"
    console.print(
        f"{len(series)} series ({how}), replayed in {replayed - recorded:.0f} s; {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
