"""Agent overhead: what attaching tightrope's agent costs a trainer, per step, at start-up
and in collectives, against the bare trainer measured in the same command, beside PyTorchFI.

1. Step time, one process, one CPU thread: the same MLP step (forward, loss, backward,
   ``optimizer.step``, ``zero_grad``) bare (the named baseline), with the agent attached and
   disarmed (``harness.attach(..., plan=None)``), attached and armed (faults armed that do
   not fire within the run), and with PyTorchFI's neuron-fault hooks injecting nothing, so
   only its hooks are timed; and the bare loop a second time, whose ratio is the noise
   floor. All train one model and optimizer on the same batches, taking turns in rounds
   (the order rotates each round), each round attaching and closing the agent anew, so
   drift on a noisy machine hits all alike. Targets: disarmed <= 1.01x, armed <= 1.05x.
   Then the time spent inside each of the agent's hooks over one attach (disarmed and
   armed): what dominates, and ``x bare (in hooks)``, the step over the step less that time,
   an estimate that other load moves far less than the round ratios.
2. Start-up: wall time of a tiny script (import torch, build a model, one step) run plainly
   (baseline) and under ``python -m harness exec`` (the zero-code attach), interleaved,
   plus the launcher alone (``exec -- true``) to split where the added time goes. Target:
   added <= 0.5 s.
3. Two ranks: a small DDP loop under torchrun (gloo), bare (baseline) and attached
   (disarmed), with torch.distributed's Python collectives counted; the agent's collectives
   per step are expected to be 0 without an ``after_seconds`` timer. A third variant with a
   timer waiting shows that the counter sees the agent's broadcasts when there are some.
4. Framework trainers (``framework_overhead.py``): Hugging Face's ``Trainer`` and
   Lightning's ``Trainer`` on a tiny GPT-2, each run a fresh process timing its own steps
   from a callback, bare (the named baseline), under ``tightrope exec`` disarmed and with
   ``TIGHTROPE_MICROSCOPE=on``, and bare again (the noise floor), in rounds. An exec run
   whose journal lacks a step of the trainer's fails its variant. Targets: disarmed <= 1.02x,
   microscope <= 1.05x, on the median step.

``ms/step (median)`` is the median of all per-step times (``time.perf_counter`` around a
whole step); ``mean`` is the median over rounds of each round's mean step time (each round
has a multiple of ``CHECK_EVERY`` (50) measured steps, so the agent's periodic check of
every parameter and gradient is in it at its share); ``floor`` is, for each position in a
round, the fastest step at that position in any round, averaged over the positions (the
check again at its share). Other work on the machine only ever adds time to a step, and on
a shared machine it moves the median and mean ratios by several per cent from one run to
the next; the floor ratios hold within a few. ``x bare (in hooks)`` is the steadiest figure:
the time spent inside the agent's own hooks over a long attach, as a share of the step.
``ok`` compares ``x bare (floor)`` with the target, give or take the noise floor (how far
``bare (again)``'s came from 1.0), and says ``unclear`` within it; section 4's compares
``x bare`` (the median step's) the same way. The JSON also has every step time and the same
figures of CPU time (``time.thread_time``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.framework_overhead import (  # noqa: E402
    FrameworkSettings,
    measure_frameworks,
    show_frameworks,
)
from faults import FaultPlan  # noqa: E402
from harness.inside.attach import CHECK_EVERY, AttachedAgent, attach  # noqa: E402
from harness.records.journal import read_journal  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks/results/agent_overhead.json"
BASELINE = "bare"
#: Faults armed from the first step that never fire within a benchmark round.
ARMED_PLAN = {
    "faults": [
        {"kind": "nan_grad", "at_step": 100000},
        {"kind": "bitflip", "every": 1000, "tensor": "weights"},
    ]
}
#: A timer that waits all run long: every step, rank 0's clock is broadcast (see Agent).
TIMER_PLAN = {"faults": [{"kind": "nan_grad", "after_seconds": 1e9}]}
TARGETS = {"disarmed": 1.01, "armed": 1.05}
STARTUP_TARGET_S = 0.5
#: The start-up script: import torch, build a small model, one training step.
TINY = (
    "import torch\n"
    "m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))\n"
    "o = torch.optim.SGD(m.parameters(), lr=0.01)\n"
    "m(torch.randn(8, 32)).pow(2).mean().backward()\n"
    "o.step()\n"
    "o.zero_grad()\n"
)
COLLECTIVES = ("broadcast", "all_reduce", "all_gather", "all_gather_object",
               "broadcast_object_list", "barrier", "reduce", "gather", "scatter")  # fmt: skip


# -- the trainer ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MLPConfig:
    """The benchmark model: ``depth`` hidden layers of ``hidden`` units, ReLU, 10 classes."""

    inputs: int = 512
    hidden: int = 768
    depth: int = 3
    batch: int = 64

    def build(self, seed: int = 0) -> nn.Sequential:
        """The model, initialised from ``seed``."""
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        width = self.inputs
        for _ in range(self.depth):
            layers += [nn.Linear(width, self.hidden), nn.ReLU()]
            width = self.hidden
        return nn.Sequential(*layers, nn.Linear(width, 10))

    def batches(self, count: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``count`` fixed batches of inputs and class labels."""
        g = torch.Generator().manual_seed(seed)
        return [
            (torch.randn(self.batch, self.inputs, generator=g),
             torch.randint(0, 10, (self.batch,), generator=g))
            for _ in range(count)
        ]  # fmt: skip


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    """One full step: forward, loss, backward, optimizer step, zero_grad."""
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


# -- the variants --------------------------------------------------------------------------


class Variant:
    """The bare trainer; subclasses add what is attached. `enter`/`leave` bracket a round.

    Every variant trains the same model and optimizer objects, so memory placement is the
    same for all; the agent and PyTorchFI's no-op hooks change no number of the training."""

    name = BASELINE

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def enter(self, run_dir: Path) -> None:
        """Before a round's steps."""

    def leave(self) -> None:
        """After them."""

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One timed step."""
        train_step(self.model, self.optimizer, x, y)


class Attached(Variant):
    """The agent attached for each round (``harness.inside.attach``), closed after it."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        name: str,
        plan: FaultPlan | None,
        check_params_every: int = CHECK_EVERY,
    ) -> None:
        super().__init__(model, optimizer)
        self.name, self.plan, self.check_every = name, plan, check_params_every
        self.agent: AttachedAgent | None = None
        self.run_dirs: list[Path] = []

    def enter(self, run_dir: Path) -> None:
        """Attach."""
        self.agent = attach(self.model, self.optimizer, run_dir=run_dir, plan=self.plan,
                            check_params_every=self.check_every)  # fmt: skip

    def leave(self) -> None:
        """Close."""
        assert self.agent is not None
        self.agent.close()
        self.run_dirs.append(self.agent.agent.run_dir)
        self.agent = None

    def journaled(self, kind: str) -> int:
        """Events of ``kind`` in the journals of every round (read after the timing)."""
        return sum(len(read_journal(d).of_kind(kind)) for d in self.run_dirs)


class PyTorchFI(Variant):
    """PyTorchFI's neuron-fault hooks on every Linear layer with no fault location declared:
    its own injection hook (``_set_value``) runs on each layer and changes nothing.

    ``declare_neuron_fi`` would put them on a deep copy of the model (see `Variant` on
    copies), so they go on the shared model through the function it calls for that,
    ``_traverse_model_set_hooks_neurons``, for each round, with its fault lists left empty
    (what ``declare_neuron_fi(batch=[], layer_num=[], dim1=[], ...)`` sets)."""

    name = "pytorchfi (no-op neuron fault)"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: MLPConfig) -> None:
        from pytorchfi.core import fault_injection  # type: ignore[import-untyped]

        super().__init__(model, optimizer)
        self.pfi = fault_injection(model, cfg.batch, input_shape=[cfg.inputs],
                                   layer_types=[nn.Linear], use_cuda=False)  # fmt: skip
        self.handles: list[Any] = []

    def enter(self, run_dir: Path) -> None:
        """Hook every Linear layer, as ``declare_neuron_fi`` hooks its copy."""
        self.handles = self.pfi._traverse_model_set_hooks_neurons(
            self.model, self.pfi.get_inj_layer_types(), False, None
        )

    def leave(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Its hooks count layers from 0 in each forward; a training loop must reset them."""
        self.pfi.reset_current_layer()
        super().step(x, y)


def pytorchfi_version() -> str | None:
    """The installed PyTorchFI's version, None when it is not installed."""
    try:
        return version("pytorchfi")
    except PackageNotFoundError:
        return None


# -- 1. step time --------------------------------------------------------------------------


def step_stats(rounds: list[list[float]], prefix: str = "") -> dict[str, float]:
    """Median step, mean (the median over rounds of each round's mean) and floor of rounds
    of step times, each round as long as the others.

    The floor: for each position in a round, the fastest step of that position in any
    round, averaged over the positions (so a periodic check is in it at its share). Other
    work on the machine only ever adds time to a step."""
    return {
        f"{prefix}median_s": statistics.median(t for r in rounds for t in r),
        f"{prefix}round_mean_s": statistics.median(statistics.fmean(r) for r in rounds),
        f"{prefix}floor_s": statistics.fmean(
            min(r[k] for r in rounds) for k in range(len(rounds[0]))
        ),
    }


@dataclass(slots=True)
class Timings:
    """One variant's step times (wall, and CPU time of this thread), per round, and its
    attach+close times."""

    rounds: list[list[float]] = field(default_factory=list)
    cpu: list[list[float]] = field(default_factory=list)
    setup: list[float] = field(default_factory=list)

    def all(self) -> list[float]:
        """Every measured step time."""
        return [t for r in self.rounds for t in r]

    def summary(self) -> dict[str, Any]:
        """`step_stats` of wall and CPU time, plain mean, spread, attach+close, every time."""
        steps = self.all()
        return {
            **step_stats(self.rounds),
            **step_stats(self.cpu, "cpu_"),
            "mean_s": statistics.fmean(steps),
            "min_s": min(steps),
            "max_s": max(steps),
            "steps": len(steps),
            "rounds": len(self.rounds),
            "enter_leave_median_s": statistics.median(self.setup),
            "wall_s_per_round": self.rounds,
            "cpu_s_per_round": self.cpu,
        }


def run_rounds(
    variants: list[Variant],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    rounds: int,
    warmup: int,
    steps: int,
    tmp: Path,
) -> dict[str, Timings]:
    """Rounds in which each variant (rotating order) runs ``warmup`` + ``steps`` steps; the
    first round is a warm-up of its own and not kept."""
    timings = {v.name: Timings() for v in variants}
    cursor = dict.fromkeys(timings, 0)  # each variant sees the same batches in turn
    for r in range(-1, rounds):
        turn = r % len(variants)
        for v in variants[turn:] + variants[:turn]:
            t0 = time.perf_counter()
            v.enter(tmp / f"{variants.index(v)}-{r + 1}")
            setup = time.perf_counter() - t0
            times, cpu = [], []
            for i in range(warmup + steps):
                x, y = batches[cursor[v.name] % len(batches)]
                cursor[v.name] += 1
                t0, c0 = time.perf_counter(), time.thread_time()
                v.step(x, y)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
                    cpu.append(time.thread_time() - c0)
            t0 = time.perf_counter()
            v.leave()
            if r >= 0:
                timings[v.name].rounds.append(times)
                timings[v.name].cpu.append(cpu)
                timings[v.name].setup.append(setup + time.perf_counter() - t0)
    return timings


def measure_steps(cfg: MLPConfig, rounds: int, warmup: int, steps: int) -> dict[str, Any]:
    """Section 1: every variant's step times and ratios to bare."""
    model = cfg.build()
    trainer = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    again = Variant(*trainer)
    again.name = f"{BASELINE} (again)"  # the same loop twice: the noise floor of a ratio
    variants: list[Variant] = [
        Variant(*trainer),
        again,
        Attached(*trainer, "disarmed", None),
        Attached(*trainer, "armed", FaultPlan.from_dict(ARMED_PLAN)),
    ]
    pfi_version = pytorchfi_version()
    pfi_skipped = None if pfi_version else "pytorchfi is not installed"
    if pfi_version is not None:
        try:
            variants.append(PyTorchFI(*trainer, cfg))
        except Exception as exc:  # an incompatible release: its row is skipped, not the run
            pfi_skipped = f"pytorchfi {pfi_version} failed: {type(exc).__name__}: {exc}"
    with tempfile.TemporaryDirectory(prefix="tightrope-bench-") as tmp:
        timings = run_rounds(variants, cfg.batches(8), rounds=rounds, warmup=warmup,
                             steps=steps, tmp=Path(tmp))  # fmt: skip
        journaled = {
            v.name: {"steps": v.journaled("step"), "faults_injected": v.journaled("fault_injected")}
            for v in variants
            if isinstance(v, Attached)
        }
    base = timings[BASELINE].summary()
    rows = []
    for v in variants:
        s = timings[v.name].summary()
        per_round = [
            statistics.median(r) / statistics.median(b)
            for r, b in zip(timings[v.name].rounds, timings[BASELINE].rounds, strict=True)
        ]
        rows.append({
            "variant": v.name, **s,
            "x_bare": s["median_s"] / base["median_s"],
            "x_bare_round_mean": s["round_mean_s"] / base["round_mean_s"],
            "x_bare_floor": s["floor_s"] / base["floor_s"],
            "x_bare_cpu_median": s["cpu_median_s"] / base["cpu_median_s"],
            "x_bare_cpu_mean": s["cpu_round_mean_s"] / base["cpu_round_mean_s"],
            "x_bare_cpu_floor": s["cpu_floor_s"] / base["cpu_floor_s"],
            "x_bare_per_round_median": statistics.median(per_round),
            "target": TARGETS.get(v.name),
            "journal": journaled.get(v.name),
        })  # fmt: skip
    return {
        "model": asdict(cfg),
        "params": sum(p.numel() for p in model.parameters()),
        "rounds": rounds,
        "warmup_steps_per_round": warmup,
        "steps_per_round": steps,
        "plan_armed": ARMED_PLAN,
        "pytorchfi": pfi_version,
        "pytorchfi_skipped": pfi_skipped,
        "rows": rows,
    }


def judge(steps: dict[str, Any], parts: dict[str, dict[str, Any]] | None) -> None:
    """Give each row with a target its verdict, and each attached row its in-hook ratio.

    The floor ratio is compared with the target, give or take the noise: how far ``bare
    (again)``'s came from 1.0. Beyond it either way: ``ok`` or ``miss``; within it:
    ``unclear``."""
    rows = {r["variant"]: r for r in steps["rows"]}
    noise = abs(rows[f"{BASELINE} (again)"]["x_bare_floor"] - 1)
    steps["noise"] = noise
    for name, row in rows.items():
        if parts and name in parts:
            b = parts[name]
            row["x_bare_in_hooks"] = b["step_ms"] / (b["step_ms"] - b["hooks_us_per_step"] / 1e3)
        if row["target"] is None:
            continue
        ratio = row["x_bare_floor"]
        if ratio - noise > row["target"]:
            row["verdict"] = "miss"
        elif ratio + noise <= row["target"]:
            row["verdict"] = "ok"
        else:
            row["verdict"] = "unclear"


#: The agent's hook entry points (top level) and parts inside them, timed by `breakdown`;
#: a name that no longer exists is left out of the table.
BREAKDOWN = (
    ("harness.inside.attached_agent", "AttachedAgent.on_forward", 0),
    ("harness.inside.step_evidence", "ParamSample.take", 1),
    ("harness.inside.agent", "Agent.begin_step", 1),
    ("harness.inside.attached_agent", "AttachedAgent.before_backward", 0),
    ("harness.inside.attached_agent", "AttachedAgent.after_backward", 0),
    ("harness.inside.step_evidence", "GradMark.of", 1),
    ("harness.inside.attached_agent", "AttachedAgent.on_step_begin", 0),
    ("harness.inside.attached_agent", "AttachedAgent.on_step_end", 0),
    ("harness.inside.agent", "params_finite", 1),
    ("harness.records.journal", "JournalWriter.emit", 1),
)


def breakdown(cfg: MLPConfig, steps: int, plan: FaultPlan | None) -> dict[str, Any]:
    """Where an attached agent's time goes: wall and CPU time inside each of its hook entry
    points (and some parts of them) over ``steps`` steps of one attach, per step."""
    import importlib

    model = cfg.build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    variant = Attached(model, optimizer, "breakdown", plan)
    spent: dict[str, list[float]] = {}  # part -> [wall, cpu]
    undo: list[tuple[Any, str, Any]] = []  # (owner, name, what was there)
    for module_name, path, _ in BREAKDOWN:
        owner: Any = importlib.import_module(module_name)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part, None)
        raw = vars(owner).get(attr) if owner is not None else None  # a classmethod as is
        if raw is None:
            continue
        original = getattr(owner, attr)

        def timed(*args: Any, _f: Any = original, _k: str = path, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return _f(*args, **kwargs)
            finally:
                acc = spent.setdefault(_k, [0.0, 0.0])
                acc[0] += time.perf_counter() - t0
                acc[1] += time.thread_time() - c0

        setattr(owner, attr, timed)
        undo.append((owner, attr, raw))
    batches = cfg.batches(8)
    try:
        with tempfile.TemporaryDirectory(prefix="tightrope-bench-") as tmp:
            variant.enter(Path(tmp))
            for i in range(20):  # warm-up
                variant.step(*batches[i % len(batches)])
            spent.clear()
            t0, c0 = time.perf_counter(), time.thread_time()
            for i in range(steps):
                variant.step(*batches[i % len(batches)])
            total, cpu = time.perf_counter() - t0, time.thread_time() - c0
            variant.leave()
    finally:
        for owner, attr, raw in undo:
            setattr(owner, attr, raw)
    rows: list[dict[str, Any]] = [
        {"part": path, "level": level, "us_per_step": 1e6 * spent[path][0] / steps,
         "cpu_us_per_step": 1e6 * spent[path][1] / steps}
        for _, path, level in BREAKDOWN
        if path in spent
    ]  # fmt: skip
    return {
        "steps": steps,
        "step_ms": 1e3 * total / steps,
        "cpu_step_ms": 1e3 * cpu / steps,
        "hooks_us_per_step": sum(r["us_per_step"] for r in rows if r["level"] == 0),
        "hooks_cpu_us_per_step": sum(r["cpu_us_per_step"] for r in rows if r["level"] == 0),
        "rows": rows,
    }


# -- 2. start-up ---------------------------------------------------------------------------


def timed_run(cmd: list[str], env: dict[str, str]) -> float:
    """Wall seconds of ``cmd``; raises when it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({proc.returncode}):\n"
                           f"{proc.stderr[-2000:]}")  # fmt: skip
    return wall


def measure_startup(runs: int) -> dict[str, Any]:
    """Section 2: the tiny script plainly, under ``tightrope exec``, and the launcher alone."""
    py = sys.executable
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    walls: dict[str, list[float]] = {"plain": [], "exec": [], "launcher alone": []}
    attached_steps = []
    with tempfile.TemporaryDirectory(prefix="tightrope-bench-") as tmp:

        def exec_cmd(run_dir: str, *command: str) -> list[str]:
            run = str(Path(tmp) / run_dir)
            return [py, "-m", "harness", "exec", "--run-dir", run, "--", *command]

        commands: dict[str, Callable[[int], list[str]]] = {
            "plain": lambda i: [py, "-c", TINY],
            "exec": lambda i: exec_cmd(f"exec-{i}", py, "-c", TINY),
            "launcher alone": lambda i: exec_cmd(f"launcher-{i}", "true"),
        }
        names = list(commands)
        timed_run([py, "-c", TINY], env)  # warm the file cache
        for i in range(runs):
            for name in names[i % 3 :] + names[: i % 3]:
                walls[name].append(timed_run(commands[name](i), env))
        for i in range(runs):
            run_dir = Path(tmp) / f"exec-{i}"
            attached_steps.append(len(read_journal(run_dir).of_kind("step")))
    med = {k: statistics.median(v) for k, v in walls.items()}
    added = med["exec"] - med["plain"]
    return {
        "runs": runs,
        "walls_s": walls,
        "median_s": med,
        "added_s": added,
        "x_plain": med["exec"] / med["plain"],
        "launcher_s": med["launcher alone"],
        "in_process_s": added - med["launcher alone"],
        "target_added_s": STARTUP_TARGET_S,
        "ok": added <= STARTUP_TARGET_S,
        "journaled_steps_per_exec_run": attached_steps,
    }


# -- 3. two ranks --------------------------------------------------------------------------


class Counter:
    """Counts calls of torch.distributed's Python collectives (outermost calls only)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self._depth = 0
        import torch.distributed as dist

        for name in COLLECTIVES:
            setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                self.calls[name] = self.calls.get(name, 0) + 1
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def total(self) -> int:
        """Calls so far."""
        return sum(self.calls.values())


def ddp_worker(args: argparse.Namespace) -> int:
    """One rank of section 3 (run by torchrun): bare, disarmed and timer rounds in turn."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    counter = Counter()
    cfg = MLPConfig(hidden=args.hidden, batch=args.batch)
    before, by_name = 0, {}
    plans = {BASELINE: None, "disarmed": None, "timer waiting": FaultPlan.from_dict(TIMER_PLAN)}
    models = {}
    for name in plans:
        model = DistributedDataParallel(cfg.build())
        models[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    batches = cfg.batches(8, seed=1 + rank)
    out: dict[str, dict[str, Any]] = {n: {"steps": [], "collectives": 0, "by_name": {}}
                                      for n in plans}  # fmt: skip
    names = list(plans)
    for r in range(-1, args.rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            model, optimizer = models[name]
            agent = None
            if name != BASELINE:
                run_dir = Path(args.ddp_worker) / f"{names.index(name)}-{r + 1}"
                agent = attach(model, optimizer, run_dir=run_dir, plan=plans[name])
            dist.barrier()  # not counted below: the rounds start together
            times = []
            for i in range(args.warmup + args.steps):
                x, y = batches[i % len(batches)]
                if i == args.warmup:
                    before, by_name = counter.total(), dict(counter.calls)
                t0 = time.perf_counter()
                train_step(model, optimizer, x, y)
                if i >= args.warmup:
                    times.append(time.perf_counter() - t0)
            if r >= 0:
                row = out[name]
                row["steps"].append(times)
                row["collectives"] += counter.total() - before
                for key, n in counter.calls.items():
                    row["by_name"][key] = row["by_name"].get(key, 0) + n - by_name.get(key, 0)
            if agent is not None:
                agent.close()
    (Path(args.ddp_worker) / f"rank-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()
    return 0


def measure_ddp(rounds: int, warmup: int, steps: int, hidden: int, batch: int) -> dict[str, Any]:
    """Section 3: run the workers under torchrun; step-time ratio and collectives per step."""
    with tempfile.TemporaryDirectory(prefix="tightrope-bench-") as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", __file__, "--ddp-worker", tmp, "--rounds", str(rounds),
               "--warmup", str(warmup), "--steps", str(steps), "--hidden", str(hidden),
               "--batch", str(batch)]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise RuntimeError(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        ranks = [json.loads((Path(tmp) / f"rank-{r}.json").read_text()) for r in range(2)]
    rows = []
    stats = {name: step_stats([r for rk in ranks for r in rk[name]["steps"]]) for name in ranks[0]}
    base = stats[BASELINE]
    for name, s in stats.items():
        count = sum(len(r) for rk in ranks for r in rk[name]["steps"])
        collectives = sum(rk[name]["collectives"] for rk in ranks)
        rows.append({
            "variant": name, **s, "steps": count,
            "x_bare": s["median_s"] / base["median_s"],
            "x_bare_round_mean": s["round_mean_s"] / base["round_mean_s"],
            "x_bare_floor": s["floor_s"] / base["floor_s"],
            "collectives_per_step_per_rank": collectives / count,
            "collectives_by_name": [rk[name]["by_name"] for rk in ranks],
            "step_s_per_round_per_rank": [rk[name]["steps"] for rk in ranks],
        })  # fmt: skip
    return {"ranks": 2, "backend": "gloo", "model": asdict(MLPConfig(hidden=hidden, batch=batch)),
            "rounds": rounds, "warmup_steps_per_round": warmup, "steps_per_round": steps,
            "timer_plan": TIMER_PLAN, "wall_s": wall, "rows": rows}  # fmt: skip


# -- output --------------------------------------------------------------------------------


def verdict(row: dict[str, Any], noise: float) -> str:
    """The ``ok`` cell of a step-time row."""
    if row["target"] is None:
        return "-"
    by = row["x_bare_floor"] - row["target"]
    return {"ok": "ok", "miss": f"MISS by {by:.3f}",
            "unclear": f"unclear ({by:+.3f}, noise {noise:.3f})"}[row["verdict"]]  # fmt: skip


def show(result: dict[str, Any]) -> None:
    """Print the tables."""
    console = Console(width=max(150, shutil.get_terminal_size().columns))
    s = result["steps"]
    title = (f"step time, 1 rank: {s['params']:,}-parameter MLP, batch {s['model']['batch']}, "
             f"{s['rounds']} rounds x {s['steps_per_round']} steps")  # fmt: skip
    table = Table(title=title)
    columns = ("variant", "ms/step (median)", "mean", "floor", "x bare", "x bare (mean)",
               "x bare (floor)", "x bare (in hooks)", "target", "ok")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col == "variant" else "right")
    for row in s["rows"]:
        target = row["target"]
        in_hooks = row.get("x_bare_in_hooks")
        table.add_row(
            row["variant"], f"{row['median_s'] * 1e3:.3f}", f"{row['round_mean_s'] * 1e3:.3f}",
            f"{row['floor_s'] * 1e3:.3f}", f"{row['x_bare']:.3f}",
            f"{row['x_bare_round_mean']:.3f}", f"{row['x_bare_floor']:.3f}",
            f"{in_hooks:.3f}" if in_hooks else "-",
            f"<= {target:.2f}" if target else "-", verdict(row, s["noise"]),
        )  # fmt: skip
    if s["pytorchfi_skipped"]:
        table.add_row("pytorchfi", *["-"] * 8, f"skipped: {s['pytorchfi_skipped']}")
    console.print(table)
    if "breakdown" in result:
        show_breakdown(console, result["breakdown"])
    if "startup" in result:
        u = result["startup"]
        m = u["median_s"]
        table = Table(title=f"start-up, tiny script, median of {u['runs']} runs")
        for col in ("variant", "wall s (median)", "x plain", "added s", "target", "ok"):
            table.add_column(col, justify="left" if col == "variant" else "right")
        table.add_row("plain", f"{m['plain']:.2f}", "1.000", "-", "-", "-")
        miss = f"MISS by {u['added_s'] - u['target_added_s']:.2f} s"
        table.add_row("tightrope exec", f"{m['exec']:.2f}", f"{u['x_plain']:.3f}",
                      f"{u['added_s']:.2f}", f"<= {u['target_added_s']}",
                      "ok" if u["ok"] else miss)  # fmt: skip
        table.add_row("  of which: launcher (exec -- true)", f"{u['launcher_s']:.2f}", "-",
                      "-", "-", "-")  # fmt: skip
        table.add_row("  of which: in the script's process", "-", "-",
                      f"{u['in_process_s']:.2f}", "-", "-")  # fmt: skip
        console.print(table)
    if "ddp" in result:
        d = result["ddp"]
        table = Table(title=f"2 ranks, DDP over gloo, {d['rounds']} rounds x "
                      f"{d['steps_per_round']} steps, hidden {d['model']['hidden']}")  # fmt: skip
        ddp_columns = (*columns[:7], "Python collectives/step/rank")
        for col in ddp_columns:
            table.add_column(col, justify="left" if col == "variant" else "right")
        for row in d["rows"]:
            table.add_row(
                row["variant"], *(f"{row[k] * 1e3:.3f}" for k in ("median_s", "round_mean_s",
                                                                  "floor_s")),
                *(f"{row[k]:.3f}" for k in ("x_bare", "x_bare_round_mean", "x_bare_floor")),
                f"{row['collectives_per_step_per_rank']:.2f}",
            )  # fmt: skip
        console.print(table)
    if "frameworks" in result:
        show_frameworks(console, result["frameworks"])


def show_breakdown(console: Console, parts: dict[str, dict[str, Any]]) -> None:
    """Print the time inside the agent's hooks, one column pair per plan."""
    first = next(iter(parts.values()))
    title = f"time inside the agent's hooks, per step ({first['steps']} steps of one attach)"
    table = Table(title=title)
    table.add_column("hook (indented: part of the one above)")
    for name in parts:
        table.add_column(f"{name} wall us", justify="right")
        table.add_column(f"{name} cpu us (% of step)", justify="right")
    for i, row in enumerate(first["rows"]):
        cells = []
        for b in parts.values():
            r = b["rows"][i]
            share = r["cpu_us_per_step"] / (10 * b["cpu_step_ms"])
            cells += [f"{r['us_per_step']:.1f}", f"{r['cpu_us_per_step']:.1f} ({share:.2f}%)"]
        table.add_row("    " * row["level"] + row["part"], *cells)
    cells = []
    for b in parts.values():
        share = b["hooks_cpu_us_per_step"] / (10 * b["cpu_step_ms"])
        cells += [
            f"{b['hooks_us_per_step']:.1f}",
            f"{b['hooks_cpu_us_per_step']:.1f} ({share:.2f}%)",
        ]
    table.add_row("all hooks", *cells)
    table.add_row("whole step (ms)", *[x for b in parts.values()
                  for x in (f"{b['step_ms']:.2f}", f"{b['cpu_step_ms']:.2f}")])  # fmt: skip
    console.print(table)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=16, help="measured rounds (default 16)")
    parser.add_argument("--steps", type=int, default=CHECK_EVERY,
                        help=f"measured steps per round, a multiple of {CHECK_EVERY}")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps per round")
    parser.add_argument("--hidden", type=int, default=768, help="MLP width (default 768)")
    parser.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--startup-runs", type=int, default=5, help="start-up runs per variant")
    parser.add_argument("--ddp-rounds", type=int, default=12, help="2-rank rounds (default 12)")
    parser.add_argument("--ddp-hidden", type=int, default=512, help="2-rank MLP width")
    parser.add_argument("--breakdown-steps", type=int, default=200,
                        help="steps of the per-hook breakdown (default 200)")  # fmt: skip
    parser.add_argument("--framework-rounds", type=int, default=4,
                        help="framework rounds, 8 processes each (default 4)")  # fmt: skip
    parser.add_argument("--framework-steps", type=int, default=100,
                        help="measured steps per framework run (default 100)")  # fmt: skip
    parser.add_argument("--framework-size", choices=["tiny", "small"], default="tiny",
                        help="the GPT-2 the framework trainers train (benchmarks/frameworks/"
                             "gpt2_sizes.py; default tiny, a step of ~14 ms)")  # fmt: skip
    parser.add_argument("--skip", action="append", default=[],
                        choices=["breakdown", "startup", "ddp", "frameworks"],
                        help="leave out a section (repeatable)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds and runs: a few minutes, rougher figures")  # fmt: skip
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--ddp-worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps % CHECK_EVERY and not args.ddp_worker:
        parser.error(
            f"--steps must be a multiple of {CHECK_EVERY} (the agent's check of every "
            "parameter and gradient comes every that many steps)"
        )
    if args.quick:  # fewer of whatever was not given
        quick = {"rounds": 6, "startup_runs": 3, "ddp_rounds": 4, "breakdown_steps": 100,
                 "framework_rounds": 2, "framework_steps": 40}  # fmt: skip
        for name, value in quick.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure every section, print the tables, write the JSON."""
    args = parse_args(argv)
    if args.ddp_worker:
        return ddp_worker(args)
    torch.set_num_threads(1)
    started, load_start = time.perf_counter(), os.getloadavg()
    if load_start[0] > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load_start[0]:.1f} on {os.cpu_count()} CPUs: other work "
              "shares them; compare ratios only", flush=True)  # fmt: skip
    cfg = MLPConfig(hidden=args.hidden, batch=args.batch)
    result: dict[str, Any] = {
        "benchmark": "agent_overhead",
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "baseline": "the same loop bare (no agent, no hooks), same process / same command",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "omp_num_threads": 1,
        "load_average_start": load_start,
    }
    print(f"1/4 step time: {args.rounds} rounds of every variant ...", flush=True)
    result["steps"] = measure_steps(cfg, args.rounds, args.warmup, args.steps)
    if "breakdown" not in args.skip:
        result["breakdown"] = {
            "disarmed": breakdown(cfg, args.breakdown_steps, None),
            "armed": breakdown(cfg, args.breakdown_steps, FaultPlan.from_dict(ARMED_PLAN)),
        }
    judge(result["steps"], result.get("breakdown"))
    if "startup" not in args.skip:
        print(f"2/4 start-up: 3 variants x {args.startup_runs} runs ...", flush=True)
        result["startup"] = measure_startup(args.startup_runs)
    if "ddp" not in args.skip:
        print(f"3/4 2 ranks under torchrun: {args.ddp_rounds} rounds ...", flush=True)
        result["ddp"] = measure_ddp(args.ddp_rounds, args.warmup, args.steps,
                                    args.ddp_hidden, args.batch // 2)  # fmt: skip
    if "frameworks" not in args.skip:
        print(f"4/4 framework trainers: {args.framework_rounds} rounds of 8 processes ...",
              flush=True)  # fmt: skip
        settings = FrameworkSettings(rounds=args.framework_rounds, steps=args.framework_steps,
                                     size=args.framework_size)  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="tightrope-bench-") as tmp:
            result["frameworks"] = measure_frameworks(settings, Path(tmp))
    result["load_average_end"] = os.getloadavg()
    result["total_wall_s"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    show(result)
    print(f"total {result['total_wall_s']} s; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
