"""Section 4 of ``agent_overhead.py``: what the zero-code attach (``tightrope exec``) costs
Hugging Face's ``Trainer`` and Lightning's ``Trainer`` per step, against the bare trainer.

Each framework trains the tiny GPT-2 of ``benchmarks/frameworks/`` (one script per
framework), which times its own steps from a callback and writes them to a file: process
start-up and imports, which dominate a short run's wall time, are not in the figures. Per
framework, four variants, each a fresh process with ``OMP_NUM_THREADS=1``: ``bare`` (the
named baseline), ``bare (again)`` (the noise floor), ``exec disarmed`` (``python -m
harness exec --run-dir D -- python script.py``, no plan) and ``exec + microscope`` (the
same with ``TIGHTROPE_MICROSCOPE=on``). They run in rounds, the order rotating each round,
both frameworks in every round, so drift on a shared machine hits all alike. An exec run
counts only when its journal holds one ``step`` event, with a finite loss, for every step
the trainer made (and, with the microscope, when the microscope recorded): otherwise the
variant is reported as failed, never timed as if the agent had watched it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.errors import JournalError
from harness.inside.microscope import MicroscopeOptions
from harness.records.journal import read_journal
from harness.records.microscope_file import MICROSCOPE_ENV, read_microscope

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks/frameworks"))
from gpt2_sizes import SIZES  # noqa: E402 - the scripts' own table, beside them

SCRIPTS = {
    "transformers": ROOT / "benchmarks/frameworks/hf_gpt2.py",
    "lightning": ROOT / "benchmarks/frameworks/lightning_gpt2.py",
}
BASELINE = "bare"
AGAIN = f"{BASELINE} (again)"
DISARMED = "exec disarmed"
MICROSCOPE = "exec + microscope"
VARIANTS = (BASELINE, AGAIN, DISARMED, MICROSCOPE)
TARGETS = {DISARMED: 1.02, MICROSCOPE: 1.05}
#: What a run's environment must not inherit from the caller's: it decides the variant.
CLEARED_ENV = ("TIGHTROPE_RUN_DIR", "TIGHTROPE_PLAN", MICROSCOPE_ENV)
RUN_TIMEOUT_S = 900


@dataclass(frozen=True, slots=True)
class FrameworkSettings:
    """How long each run trains and how many rounds there are."""

    rounds: int = 4
    warmup: int = 10
    """Steps of each run left out of the figures (the first allocations, lazy set-ups)."""
    steps: int = 100
    """Steps of each run measured, after the warm-up."""
    batch: int = 8
    size: str = "tiny"
    """The model (``benchmarks/frameworks/gpt2_sizes.py``)."""


@dataclass(slots=True)
class VariantRuns:
    """One variant of one framework: the measured step times of each run, or why it failed."""

    step_s: list[list[float]] = field(default_factory=list)
    cpu_s: list[list[float]] = field(default_factory=list)
    journal_steps: list[int] = field(default_factory=list)
    failure: str | None = None


def run_env(variant: str) -> dict[str, str]:
    """The environment of one run: this one's, one CPU thread, this checkout first on the
    path (the bare and the attached trainer import the same code), the microscope only
    where the variant asks for it."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=path)
    if variant == MICROSCOPE:
        env[MICROSCOPE_ENV] = "on"
    return env


def run_command(variant: str, script: Path, run_dir: Path, out: Path, total: int,
                settings: FrameworkSettings) -> list[str]:  # fmt: skip
    """The command line of one run: the trainer script, under ``tightrope exec`` or not."""
    trainer = [sys.executable, str(script), "--steps", str(total), "--batch",
               str(settings.batch), "--size", settings.size, "--out", str(out)]  # fmt: skip
    if variant in (BASELINE, AGAIN):
        return trainer
    return [sys.executable, "-m", "harness", "exec", "--run-dir", str(run_dir), "--", *trainer]


def observed(variant: str, run_dir: Path, trainer_steps: int) -> tuple[int, str | None]:
    """Journaled steps of an exec run, and what is wrong when the agent did not watch the
    whole run (a step missing, no loss observed, no microscope records); None for bare."""
    if variant in (BASELINE, AGAIN):
        return trainer_steps, None
    try:
        steps = read_journal(run_dir).of_kind("step")
    except JournalError as exc:  # the agent never started: no journal at all
        return 0, str(exc)
    if len(steps) != trainer_steps:
        return len(steps), f"journal holds {len(steps)} steps, the trainer made {trainer_steps}"
    lost = sum(not math.isfinite(float(e.fields.get("loss", math.nan))) for e in steps)
    if lost:
        return len(steps), f"{lost} journaled steps have no finite loss (no model observed)"
    due = trainer_steps >= MicroscopeOptions().every  # its first periodic record
    if variant == MICROSCOPE and due and not read_microscope(run_dir):
        return len(steps), "the microscope recorded nothing"
    return len(steps), None


def run_once(framework: str, variant: str, where: Path, settings: FrameworkSettings,
             runs: VariantRuns) -> None:  # fmt: skip
    """One run of one variant; its measured step times (or its failure) go into ``runs``."""
    where.mkdir(parents=True)
    out, run_dir = where / "steps.json", where / "run"
    total = settings.warmup + settings.steps
    cmd = run_command(variant, SCRIPTS[framework], run_dir, out, total, settings)
    proc = subprocess.run(cmd, cwd=ROOT, env=run_env(variant), capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip
    if proc.returncode or not out.exists():
        runs.failure = f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}"
        return
    made = json.loads(out.read_text())
    if made["steps"] != total or len(made["step_s"]) != total:
        runs.failure = f"the trainer made {made['steps']} steps, {total} asked"
        return
    journaled, problem = observed(variant, run_dir, made["steps"])
    if problem:
        runs.failure = problem
        return
    runs.step_s.append(made["step_s"][settings.warmup :])
    runs.cpu_s.append(made["cpu_s"][settings.warmup :])
    runs.journal_steps.append(journaled)


def summarize(runs: dict[str, VariantRuns]) -> dict[str, Any]:
    """Rows of one framework, each variant's ratios to bare, the noise floor and verdicts."""
    rows: list[dict[str, Any]] = []
    base = runs[BASELINE]
    stats = {}
    for name, r in runs.items():
        if r.failure is None and r.step_s:
            stats[name] = {
                "median_s": statistics.median(t for run in r.step_s for t in run),
                "run_mean_s": statistics.median(statistics.fmean(run) for run in r.step_s),
                "cpu_median_s": statistics.median(t for run in r.cpu_s for t in run),
            }
    for name, r in runs.items():
        row: dict[str, Any] = {"variant": name, "target": TARGETS.get(name),
                               "failure": r.failure, "journal_steps": r.journal_steps}  # fmt: skip
        if name in stats and BASELINE in stats:
            s, b = stats[name], stats[BASELINE]
            row.update(s, runs=len(r.step_s), steps=sum(map(len, r.step_s)),
                       x_bare=s["median_s"] / b["median_s"],
                       x_bare_mean=s["run_mean_s"] / b["run_mean_s"],
                       x_bare_cpu=s["cpu_median_s"] / b["cpu_median_s"],
                       x_bare_per_run=[statistics.median(v) / statistics.median(w) for v, w
                                       in zip(r.step_s, base.step_s, strict=False)],
                       step_s_per_run=r.step_s, cpu_s_per_run=r.cpu_s)  # fmt: skip
        rows.append(row)
    by_name = {row["variant"]: row for row in rows}
    noise = abs(by_name[AGAIN]["x_bare"] - 1) if "x_bare" in by_name[AGAIN] else None
    for row in rows:
        row["verdict"] = judge(row, noise)
    return {"noise": noise, "rows": rows}


def judge(row: dict[str, Any], noise: float | None) -> str | None:
    """``ok``, ``miss`` or ``unclear`` (the median ratio within the noise floor of the
    target), ``failed``; None for a row without a target."""
    if row["target"] is None:
        return "failed" if row["failure"] else None
    if "x_bare" not in row:
        return "failed"
    noise = noise or 0.0  # bare (again) failed: no floor to give or take
    if row["x_bare"] - noise > row["target"]:
        return "miss"
    return "ok" if row["x_bare"] + noise <= row["target"] else "unclear"


def measure_frameworks(settings: FrameworkSettings, tmp: Path) -> dict[str, Any]:
    """Section 4: every variant of every framework, in rounds; the summary per framework."""
    started = time.perf_counter()
    runs = {fw: {v: VariantRuns() for v in VARIANTS} for fw in SCRIPTS}
    for r in range(settings.rounds):
        turn = r % len(VARIANTS)
        for framework in SCRIPTS:
            for variant in VARIANTS[turn:] + VARIANTS[:turn]:
                mine = runs[framework][variant]
                if mine.failure is None:  # a failure repeats; later rounds leave it out
                    where = tmp / framework / f"{VARIANTS.index(variant)}-{r}"
                    run_once(framework, variant, where, settings, mine)
    return {
        "model": f"GPT2Config(**{SIZES[settings.size].config()})",
        "settings": asdict(settings),
        "targets": TARGETS,
        "frameworks": {fw: summarize(v) for fw, v in runs.items()},
        "wall_s": round(time.perf_counter() - started, 1),
    }


def verdict_cell(row: dict[str, Any], noise: float | None) -> str:
    """The ``ok`` cell of a row."""
    if row["verdict"] is None:
        return "-"
    if row["verdict"] == "failed":
        return f"FAILED: {row['failure'] or 'bare failed'}"
    by, noise = row["x_bare"] - row["target"], noise or 0.0
    return {"ok": "ok", "miss": f"MISS by {by:.3f}",
            "unclear": f"unclear ({by:+.3f}, noise {noise:.3f})"}[row["verdict"]]  # fmt: skip


def show_frameworks(console: Console, result: dict[str, Any]) -> None:
    """Print section 4's table: one block of rows per framework."""
    s = result["settings"]
    title = (f"tightrope exec on framework trainers: {s['size']} GPT-2, batch {s['batch']}, "
             f"{s['rounds']} rounds x {s['steps']} steps (+{s['warmup']} warm-up)")  # fmt: skip
    table = Table(title=title)
    columns = ("framework", "variant", "ms/step (median)", "mean", "x bare", "x bare (mean)",
               "x bare (cpu)", "journaled steps", "target", "ok")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col in columns[:2] else "right")
    for framework, fw in result["frameworks"].items():
        for i, row in enumerate(fw["rows"]):
            timed = "x_bare" in row
            journaled = sum(row["journal_steps"]) if row["variant"] in TARGETS else None
            table.add_row(
                framework if i == 0 else "", row["variant"],
                f"{row['median_s'] * 1e3:.2f}" if timed else "-",
                f"{row['run_mean_s'] * 1e3:.2f}" if timed else "-",
                f"{row['x_bare']:.3f}" if timed else "-",
                f"{row['x_bare_mean']:.3f}" if timed else "-",
                f"{row['x_bare_cpu']:.3f}" if timed else "-",
                f"{journaled:,}" if journaled is not None else "-",
                f"<= {row['target']:.2f}" if row["target"] else "-",
                verdict_cell(row, fw["noise"]),
                end_section=i == len(fw["rows"]) - 1,
            )  # fmt: skip
    console.print(table)
