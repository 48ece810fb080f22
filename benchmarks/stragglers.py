"""Straggler detection: latency in steps and false alarms per 1,000 clean steps, on 2 ranks.

Two processes (gloo, one thread each) train a small MLP in lockstep, each step ending in
an all-reduce, as the reference trainer's steps do. Rank 1 is slowed by tightrope's own
``straggler`` fault (`faults.slow.StragglerInjector`: busy work on its core after the
backward pass) for episodes of ``--fault-steps`` steps at factors 1.2x, 1.5x, 2x and 5x,
between stretches of clean steps; a stretch of ``--clean-steps`` clean steps comes first.
Each rank measures its compute time as the reference trainer's mechanism does (the step's
time less the time inside all-reduces, timed by the collective ledger) and rank 0 writes
both ranks' rows.

The rows are then scored offline with the trainer's own `StragglerScores` for each
threshold of `THRESHOLDS` (window and patience as given), then at the baseline threshold
for each (window, patience) of `SHAPES`. An episode counts as
detected when rank 1 is flagged within it or in the ``patience + window`` steps after it
(the flag lags the slowdown); its latency is the flag's step less the episode's first.
Every other flag (rank 0 ever, rank 1 outside those steps) is a false alarm, counted per
1,000 clean steps. Precision = detected episodes / (detected + false alarms), recall =
detected / episodes. The baseline is NVIDIA's resiliency extension's default threshold,
0.7, scored in the same command on the same rows: each other threshold's figures are
also given as ratios against it.

    .venv/bin/python benchmarks/stragglers.py              # ~2-4 minutes on 2 cores
    .venv/bin/python benchmarks/stragglers.py --quick      # fewer steps: ~1 minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FACTORS = (1.2, 1.5, 2.0, 5.0)
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)
BASELINE = 0.7
#: (window, patience) pairs scored at the baseline threshold, on the same rows.
SHAPES = ((1, 3), (1, 4), (1, 5), (3, 3), (3, 5), (5, 5))


def worker(rank: int, store: str, plan: list[dict[str, Any]], out: str) -> None:
    """One rank: the steps of ``plan`` (each ``{"factor": f}``, 1.0 clean), timed."""
    import torch
    import torch.distributed as dist

    from faults import parse_fault
    from faults.injector import StepContext
    from faults.slow import StragglerInjector
    from reference_trainer.processes.collective_ledger import CollectiveLedger

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ledger = CollectiveLedger(None, rank, 0).install()
    torch.manual_seed(0)
    width = 512  # a step of some 10-20 ms on one core, a tenth of the tiny trainer's
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, 1),
    )  # fmt: skip
    data = torch.randn(128, width)
    injectors: dict[float, StragglerInjector] = {}
    rows: list[list[float]] = []
    for n, step in enumerate(plan, 1):
        factor = float(step["factor"])
        ctx = StepContext(step=n, rank=rank, world_size=2)
        injector = None
        if factor > 1.0 and rank == 1:
            spec = parse_fault({"kind": "straggler", "at_step": 1, "factor": factor})
            injector = injectors.setdefault(factor, StragglerInjector(spec))
        started = time.perf_counter()
        ledger.take_seconds()
        if injector is not None:
            injector.before_forward(ctx)
        loss = model(data).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
        if injector is not None:
            injector.after_backward(ctx)
        compute = time.perf_counter() - started - ledger.take_seconds()
        shared = torch.zeros(2)
        shared[rank] = compute
        dist.all_reduce(shared)  # the step's agreement, which carries the times
        model.zero_grad(set_to_none=True)
        rows.append(shared.tolist())
    ledger.uninstall()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


@dataclass(frozen=True, slots=True)
class Episode:
    factor: float
    first: int
    last: int


def make_plan(
    clean: int, episodes: int, fault_steps: int, gap: int
) -> tuple[list[float], list[Episode]]:
    """Per step its factor (1.0 clean), and the fault episodes (1-based steps)."""
    factors: list[float] = [1.0] * clean
    found: list[Episode] = []
    for factor in FACTORS:
        for _ in range(episodes):
            factors += [1.0] * gap
            first = len(factors) + 1
            factors += [factor] * fault_steps
            found.append(Episode(factor, first, len(factors)))
    return factors + [1.0] * gap, found


def measure(factors: list[float]) -> list[list[float]]:
    """Run the two ranks; rank 0's rows of both ranks' compute seconds."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        store, out = str(Path(tmp) / "store"), str(Path(tmp) / "rows.json")
        plan = [{"factor": f} for f in factors]
        mp.start_processes(worker, args=(store, plan, out), nprocs=2, start_method="spawn")
        return json.loads(Path(out).read_text())  # type: ignore[no-any-return]


@dataclass(slots=True)
class Score:
    threshold: float
    window: int
    patience: int
    detected: dict[float, int]
    latency: dict[float, float | None]
    false_alarms: int
    clean_steps: int

    @property
    def per_1000(self) -> float:
        return 1000.0 * self.false_alarms / max(self.clean_steps, 1)

    def precision(self) -> float | None:
        hits = sum(self.detected.values())
        return None if hits + self.false_alarms == 0 else hits / (hits + self.false_alarms)


def score(
    rows: list[list[float]], episodes: list[Episode], threshold: float, window: int, patience: int
) -> Score:
    """Score the rows at ``threshold`` (see the module's doc)."""
    from reference_trainer.stability.stragglers import StragglerConfig, StragglerScores

    cfg = StragglerConfig(threshold=threshold, window=window, patience=patience)
    scores = StragglerScores(cfg, 2)
    lag = window + patience
    owner: dict[int, Episode] = {}
    for e in episodes:
        for s in range(e.first, e.last + lag + 1):
            owner.setdefault(s, e)
    hits: dict[Episode, int] = {}
    false_alarms = 0
    for step, row in enumerate(rows, 1):
        for flag in scores.observe(step, row):
            episode = owner.get(step)
            if flag.rank == 1 and episode is not None:
                hits.setdefault(episode, step - episode.first)
            else:
                false_alarms += 1
    clean = sum(1 for s in range(1, len(rows) + 1) if s not in owner)
    detected = {f: sum(1 for e in hits if e.factor == f) for f in FACTORS}
    latency = {
        f: (statistics.median(v) if (v := [d for e, d in hits.items() if e.factor == f]) else None)
        for f in FACTORS
    }
    return Score(threshold, window, patience, detected, latency, false_alarms, clean)


def table(scores: list[Score], base: Score, episodes: int) -> str:
    """The precision/recall table, one row per setting, ratios against the baseline."""
    head = ["threshold, window, patience"]
    head += [f"recall {f:g}x" for f in FACTORS]
    head += [f"latency {f:g}x" for f in FACTORS]
    head += ["false alarms /1000", "precision", "vs 0.7: false alarms", "vs 0.7: recall"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in scores:
        recall = [s.detected[f] / episodes for f in FACTORS]
        lat = [("-" if s.latency[f] is None else f"{s.latency[f]:g}") for f in FACTORS]
        p = s.precision()
        total, base_total = sum(s.detected.values()), sum(base.detected.values())
        fa_ratio = "-" if base.false_alarms == 0 else f"{s.false_alarms / base.false_alarms:.2f}"
        rc_ratio = "-" if base_total == 0 else f"{total / base_total:.2f}"
        cells = [
            f"{s.threshold:g}, {s.window}, {s.patience}" + (" (baseline)" if s is base else "")
        ]
        cells += [f"{r:.2f}" for r in recall] + lat
        cells += [f"{s.per_1000:.1f}", "-" if p is None else f"{p:.2f}", fa_ratio, rc_ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean-steps", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=5, help="fault episodes per factor")
    parser.add_argument("--fault-steps", type=int, default=12)
    parser.add_argument("--gap", type=int, default=15, help="clean steps before each episode")
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--patience", type=int, default=5)
    parser.add_argument(
        "--rescore", type=Path, help="score the rows of an earlier result file, measure nothing"
    )
    parser.add_argument("--quick", action="store_true", help="300 clean steps, 3 episodes")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/stragglers.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.clean_steps, args.episodes = 300, 3
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    factors, episodes = make_plan(args.clean_steps, args.episodes, args.fault_steps, args.gap)
    started = time.monotonic()
    if args.rescore is not None:
        earlier = json.loads(args.rescore.read_text())
        rows, episodes = earlier["rows"], [Episode(**e) for e in earlier["episodes"]]
        args.clean_steps = earlier["settings"]["clean_steps"]
        args.episodes = earlier["settings"]["episodes"]
        args.fault_steps = earlier["settings"]["fault_steps"]
        seconds = float(earlier["seconds"])
    else:
        rows = measure(factors)
        seconds = time.monotonic() - started
    scores = [score(rows, episodes, t, args.window, args.patience) for t in THRESHOLDS]
    base = next(s for s in scores if s.threshold == BASELINE)
    shapes = [score(rows, episodes, BASELINE, w, p) for w, p in SHAPES]
    print(
        f"{len(rows)} steps on 2 ranks in {seconds:.0f} s; {args.episodes} episodes of "
        f"{args.fault_steps} steps per factor; window {args.window}, patience {args.patience}"
    )
    print(table(scores, base, args.episodes))
    print(f"\nAt threshold {BASELINE:g}, other windows and patiences, on the same rows:")
    print(table(shapes, base, args.episodes))
    clean_ms = [1000 * statistics.median(r) for r in rows[: args.clean_steps]]
    result = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "steps": len(rows),
        "seconds": round(seconds, 1),
        "clean_step_compute_ms_median": round(statistics.median(clean_ms), 3),
        "baseline_threshold": BASELINE,
        "scores": [
            asdict(s) | {"false_alarms_per_1000": s.per_1000, "precision": s.precision()}
            for s in [*scores, *shapes]
        ],
        "rows": rows,
        "episodes": [asdict(e) for e in episodes],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
