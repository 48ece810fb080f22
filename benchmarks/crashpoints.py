"""Crash-point exploration side by side: ``tightrope crashpoints`` against ``ckpt-chaos run``
(issue #30, item 5), on the same trainer, the same crash points and the same cores.

Both tools record the file events of a fault-free run's saves, kill a fresh run at each
event (``before``) and cut each file a torn-able writer wrote to half (``torn``), resume
with the job's own resume and classify the point PASS / HARD_FAIL / SILENT_DIVERGENCE /
LOST_WORK. ckpt-chaos (the named baseline, run first) compares the final weights the trainer
writes (``--result-file``: the bytes of ``final.safetensors``, see
``tests/frameworks/final_weights.py``) and finds lost work from the checkpoint folders
(``--checkpoint-glob``, ``--step-regex``); tightrope judges from its own evidence (the
agent's parameter fingerprints, the loads it observed, the bytes saved). By default every
event of every mode is a point in both; with ``--max-points`` ckpt-chaos draws its even
sample (half per mode) and tightrope runs the same points (``--only``).

A point is matched across the tools by its event's number in the run, its mode and the name
of the file (or folder) the event touched (ckpt-chaos logs names without their folder). The
table shows, per point, both verdicts; the summary the counts, the points on which they agree
and the wall-time ratio tightrope / ckpt-chaos (goal: the same verdict everywhere in at most
0.5 of the time).

Installs nothing: without the ``ckpt-chaos`` package (``pip install ckpt-chaos==0.1.8``, in
the ``dev`` extra) it says so and exits 2. JSON to ``benchmarks/results/crashpoints.json``.

```console
.venv/bin/python benchmarks/crashpoints.py                    # the HF Trainer, 2 cores
.venv/bin/python benchmarks/crashpoints.py --target lightning --keep /tmp/cp
```
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
SLOT = "{dir}"  # the run's own folder, {out} for ckpt-chaos and {run_dir} for tightrope
RESULT = "final.safetensors"


@dataclass(frozen=True, slots=True)
class Target:
    """A trainer both tools run: its train and resume commands (with `SLOT`), the file its
    final weights land in, and how ckpt-chaos finds its checkpoints and the resumed step."""

    train: tuple[str, ...]
    resume: tuple[str, ...] | None
    checkpoint_glob: str
    step_regex: str


def _hf() -> Target:
    script = str(ROOT / "tests/frameworks/hf_trainer.py")
    train = (sys.executable, script, "--steps", "2", "--save-every", "2", "--out", SLOT,
             "--final-weights", f"{SLOT}/{RESULT}")  # fmt: skip
    return Target(train, None, "{out}/checkpoint-*", r"resuming training at \S*checkpoint-(\d+)")


def _lightning() -> Target:
    script = str(ROOT / "tests/frameworks/lightning_trainer.py")
    train = (sys.executable, script, "--steps", "2", "--save-every", "2", "--out", SLOT,
             "--final-weights", f"{SLOT}/{RESULT}")  # fmt: skip
    return Target(train, None, "{out}/ckpt/epoch=*.ckpt", r"resuming at step (\d+)")


TARGETS = {"hf_trainer": _hf, "lightning": _lightning}


def _fill(cmd: tuple[str, ...], slot: str) -> list[str]:
    return [part.replace(SLOT, slot) for part in cmd]


def _env() -> dict[str, str]:
    """This checkout first on the path, one thread per process (cores are the tools' jobs)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


def run_ckpt_chaos(target: Target, work: Path, cores: int, timeout: int,
                   max_points: int) -> dict[str, Any]:  # fmt: skip
    """ckpt-chaos on its even sample of ``max_points`` (split between the modes); its
    per-point verdicts by match key."""
    cmd = [sys.executable, "-m", "ckpt_chaos", "run", "--work", str(work), "--jobs", str(cores),
           "--max-points", str(max_points), "--timeout", str(timeout),
           "--result-file", "{out}/" + RESULT, "--checkpoint-glob", target.checkpoint_glob,
           "--step-regex", target.step_regex]  # fmt: skip
    if target.resume:
        cmd += ["--resume-cmd", " ".join(_fill(target.resume, "{out}"))]
    cmd += ["--", *_fill(target.train, "{out}")]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    return {"wall_s": wall, "exit": proc.returncode, "points": ckpt_chaos_points(work),
            "only": tightrope_indices(work), "tail": proc.stdout[-3000:]}  # fmt: skip


def tightrope_indices(work: Path) -> list[int]:
    """The indices ``tightrope crashpoints --only`` gives the points ckpt-chaos ran: tightrope
    numbers every event's ``before`` point and then, where the writer can be torn, its
    ``torn`` point, in event order (the same events, as both tools record them alike)."""
    log = work / "reference" / "events.log.rank0"
    order: list[tuple[int, str]] = []
    for line in log.read_text().splitlines():
        n, _, _, tornable = line.split("\t")
        order.append((int(n), "before"))
        if tornable == "1":
            order.append((int(n), "torn"))
    ran = {
        tuple(json.loads(p.read_text()).get("point") or ()) for p in work.glob("pt_*/result.json")
    }
    return [i for i, point in enumerate(order) if point in ran]


def ckpt_chaos_points(work: Path) -> dict[str, str]:
    """ckpt-chaos's verdict of each point in its folder ``work``, by match key (its control
    run left out). It names the job's own folder ``out``, tightrope ``.``."""
    from ckpt_chaos.invariants import ResumeOutcome, classify

    found: list[tuple[int, str, str, str]] = []
    for path in work.glob("pt_*/result.json"):
        rec = json.loads(path.read_text())
        if "point" not in rec:
            continue
        n, mode = rec["point"]
        name = Path(rec["event"][1]).name
        verdict = classify(ResumeOutcome(**rec["outcome"]))
        found.append((n, mode, "." if name == "out" else name, verdict))
    return _by_key(found)


def tightrope_points(doc: dict[str, Any]) -> dict[str, str]:
    """tightrope's verdict of each point of its ``crashpoints.json``, by match key."""
    found = [(p["event"]["n"], p["mode"], Path(p["event"]["path"]).name or ".", p["verdict"])
             for p in doc["points"]]  # fmt: skip
    return _by_key(found)


def _by_key(found: list[tuple[int, str, str, str]]) -> dict[str, str]:
    """Verdicts keyed ``#n mode name`` from (event number, mode, name, verdict). Both tools
    number the job's file events alike (the same audit events and writers, from 1), so a
    key names the same file event in either; an event they name differently shows as two
    rows, each with one verdict."""
    return {f"#{n} {mode} {name}": verdict for n, mode, name, verdict in sorted(found)}


def run_tightrope(target: Target, out: Path, cores: int, timeout: int,
                  only: list[int]) -> dict[str, Any]:  # fmt: skip
    """``tightrope crashpoints --only`` the points ckpt-chaos ran; its verdicts by match key."""
    cmd = [sys.executable, "-m", "harness", "crashpoints", "--out", str(out),
           "--cores", str(cores), "--timeout", str(timeout), "--json",
           "--only", ",".join(map(str, only))]  # fmt: skip
    if target.resume:
        cmd += ["--resume-command", " ".join(_fill(target.resume, "{run_dir}"))]
    cmd += ["--", *_fill(target.train, "{run_dir}")]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    report = out / "crashpoints.json"
    if not report.exists():
        return {"wall_s": wall, "exit": proc.returncode, "points": {},
                "tail": (proc.stdout + proc.stderr)[-3000:]}  # fmt: skip
    doc = json.loads(report.read_text())
    return {"wall_s": wall, "exit": proc.returncode, "deterministic": doc.get("deterministic"),
            "points": tightrope_points(doc),
            "summary": doc.get("summary"), "tail": proc.stdout[-3000:]}  # fmt: skip


def compare(chaos: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Per point both verdicts, the agreement and the wall-time ratio."""
    keys = list(chaos["points"]) + [k for k in ours["points"] if k not in chaos["points"]]
    rows = [{"point": k, "ckpt_chaos": chaos["points"].get(k), "tightrope": ours["points"].get(k)}
            for k in keys]  # fmt: skip
    both = [r for r in rows if r["ckpt_chaos"] and r["tightrope"]]
    same = sum(r["ckpt_chaos"] == r["tightrope"] for r in both)
    ratio = ours["wall_s"] / chaos["wall_s"] if chaos["wall_s"] else None
    return {
        "rows": rows,
        "matched": len(both),
        "same_verdict": same,
        "only_ckpt_chaos": sum(r["tightrope"] is None for r in rows),
        "only_tightrope": sum(r["ckpt_chaos"] is None for r in rows),
        "counts": {
            "ckpt_chaos": Counter(chaos["points"].values()),
            "tightrope": Counter(ours["points"].values()),
        },
        "wall_ratio": ratio,
        "goal_met": same == len(rows) and ratio is not None and ratio <= 0.5,
    }


def print_table(name: str, cores: int, chaos: dict[str, Any], ours: dict[str, Any],
                result: dict[str, Any]) -> None:  # fmt: skip
    """Per point both verdicts, then the summary line."""
    table = Table(title=f"crash points of {name}, {cores} cores (baseline: ckpt-chaos)")
    for column in ("point", "ckpt-chaos", "tightrope", "same"):
        table.add_column(column)
    for row in result["rows"]:
        same = "yes" if row["ckpt_chaos"] == row["tightrope"] else "NO"
        table.add_row(row["point"], row["ckpt_chaos"] or "-", row["tightrope"] or "-", same)
    Console().print(table)
    for tool, counts in result["counts"].items():
        print(f"{tool}: " + ", ".join(f"{v} {c}" for v, c in sorted(counts.items())))
    ratio = result["wall_ratio"]
    print(f"same verdict on {result['same_verdict']} of {len(result['rows'])} points; "
          f"wall: ckpt-chaos {chaos['wall_s']:.0f} s, tightrope {ours['wall_s']:.0f} s, "
          f"ratio {ratio:.2f}" if ratio else "no ratio")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=sorted(TARGETS), default="hf_trainer")
    parser.add_argument("--cores", type=int, default=2, help="points at once, in each tool")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per run of the job")
    parser.add_argument(
        "--max-points",
        type=int,
        default=10000,
        help="a sample: ckpt-chaos's even one (half per mode); tightrope runs the same points",
    )
    parser.add_argument("--keep", type=Path, help="keep both tools' folders here")
    parser.add_argument(
        "--reread",
        action="store_true",
        help="run nothing: match the points again from --keep and the wall times of --out",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/crashpoints.json")
    args = parser.parse_args()
    if importlib.util.find_spec("ckpt_chaos") is None:
        print("ckpt-chaos is not installed: pip install ckpt-chaos==0.1.8 (the dev extra)")
        return 2
    target = TARGETS[args.target]()
    load = {"before": os.getloadavg()[0]}
    if args.reread:
        if args.keep is None:
            parser.error("--reread needs --keep (the folders of an earlier run)")
        before = json.loads(args.out.read_text())
        chaos, ours = before["ckpt_chaos"], before["tightrope"]
        chaos["points"] = ckpt_chaos_points(args.keep / "ckpt-chaos")
        report = json.loads((args.keep / "tightrope" / "crashpoints.json").read_text())
        ours["points"] = tightrope_points(report)
        load = before["load_average"]
    else:
        with tempfile.TemporaryDirectory(prefix="crashpoints-bench-") as name:
            tmp = args.keep or Path(name)
            chaos = run_ckpt_chaos(
                target, tmp / "ckpt-chaos", args.cores, args.timeout, args.max_points
            )
            ours = run_tightrope(target, tmp / "tightrope", args.cores, args.timeout, chaos["only"])
        load["after"] = os.getloadavg()[0]
    result = compare(chaos, ours)
    doc = {
        "benchmark": "crashpoints",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "target": args.target,
        "cores": args.cores,
        "baseline": "ckpt-chaos run (0.1.8), same trainer, same cores",
        "load_average": load,
        "command": sys.argv,
        "ckpt_chaos": chaos,
        "tightrope": ours,
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=dict))
    print_table(args.target, args.cores, chaos, ours, result)
    print(f"wrote {args.out}")
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
