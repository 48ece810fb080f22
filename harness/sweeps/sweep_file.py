"""A sweep file: one scenario, a grid of trainer settings, and the seeds to run each with.

```yaml
sweep: beta2
description: What the sweep asks.
scenario:            # a suite's scenario: trainer, faults, expect (name optional)
  trainer: {model: tiny, steps: 150}
  faults: [{kind: lr_spike, probability: 0.02, factor: 30}]
  expect: {completed: true, final_loss_within: 0.1}
grid:                # trainer field (dotted) -> the values to try
  optimizer.beta2: [0.999, 0.98, 0.95]
seeds: 20            # 0..19, or a list of seeds
min_success: 0.5     # optional: a cell below this success rate fails the sweep
arms:                # optional: named sets of mechanisms on (`harness.sweeps.arms`)
  fragile: []
  guarded: [nonfinite_guard, clipping]
fault_mix: {rate: 0.02}  # optional: faults drawn per seed as a soak draws them
```

Every cell of the grid (the product of its lists) runs the scenario once per seed: the
seed is the trainer's ``seed``, and is added to every fault's own ``seed``, so that
faults drawn at random (``probability``, a random rank) differ between seeds the same way
in every cell. Problems are reported all at once, each with its file and line, before
anything runs; docs/sweeps.md is the reference.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.suites.scenario import Scenario, TrainerSpec
from harness.suites.suite_loader import Problems, ScenarioError, parse_suite, read_yaml
from harness.sweeps.arms import ARM_FIELDS, Arm, parse_arms
from harness.sweeps.fault_mix import FaultMix, parse_fault_mix

_KEYS = ("sweep", "description", "scenario", "arms", "fault_mix", "grid", "seeds", "min_success")
#: The most runs one sweep may ask for (cells times seeds).
MAX_RUNS = 10_000
#: Trainer fields a grid may not set: the seeds are the sweep's own axis, and how a run is
#: launched or sampled is not what it computes. (A command trainer's variants are swept as
#: ``command`` or as ``env.NAME``.)
_NOT_SWEPT = ("seed", "launcher", "cwd", "sample_command")

Path_ = tuple[str | int, ...]


class SweepError(ScenarioError):
    """A sweep file is unreadable or invalid; ``problems`` holds one line per problem."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One point of the grid: a value for each swept field, in the grid's order."""

    index: int
    settings: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        """``optimizer.beta2=0.98, precision=fp16`` (``default`` for an empty grid)."""
        return ", ".join(f"{k}={_show(v)}" for k, v in self.settings) or "default"

    @property
    def slug(self) -> str:
        """A name fit for a run directory: ``cell01``."""
        return f"cell{self.index:02d}"


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


@dataclass(frozen=True, slots=True)
class Sweep:
    """A validated sweep: its scenario, cells and seeds."""

    name: str
    description: str
    scenario: Scenario
    grid: tuple[tuple[str, tuple[Any, ...]], ...]
    seeds: tuple[int, ...]
    min_success: float | None = None
    source: str = "<memory>"
    #: Named sets of mechanisms switched on: the slowest axis of the cells (``arm=NAME``).
    arms: tuple[Arm, ...] = ()
    #: Faults drawn per seed as a soak draws them, after the scenario's own.
    fault_mix: FaultMix | None = None

    def cells(self) -> list[Cell]:
        """The grid's points, the arms first, then the first field varying slowest."""
        axes = ([("arm", tuple(a.name for a in self.arms))] if self.arms else []) + list(self.grid)
        values = [v for _, v in axes]
        names = [k for k, _ in axes]
        return [
            Cell(i, tuple(zip(names, combo, strict=True)))
            for i, combo in enumerate(itertools.product(*values), start=1)
        ]

    def run_scenario(self, cell: Cell, seed: int) -> Scenario:
        """The scenario of one run: the cell's settings and the seed applied."""
        return with_settings(self.scenario, cell, seed, self.arms, self.fault_mix)

    @property
    def runs(self) -> int:
        """How many runs the sweep makes."""
        return len(self.cells()) * len(self.seeds)


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``a.b.c`` in nested mappings, making the missing ones (a value that is no
    mapping, such as an optimizer given by name, becomes ``{"name": value}``)."""
    *parents, last = path.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if isinstance(child, str):
            child = {"name": child}
        elif not isinstance(child, dict):
            child = {}
        node[part] = child = dict(child)
        node = child
    node[last] = value


def with_settings(
    scenario: Scenario,
    cell: Cell,
    seed: int,
    arms: tuple[Arm, ...] = (),
    fault_mix: FaultMix | None = None,
) -> Scenario:
    """``scenario`` renamed for the run, its trainer set to the cell (its arm's mechanisms
    first) and the seed, with the seed's drawn fault mix."""
    trainer = scenario.trainer.model_dump(mode="json", exclude_unset=True)
    by_name = {a.name: a for a in arms}
    settings = [kv for kv in cell.settings if kv[0] != "arm"]
    for _, name in [kv for kv in cell.settings if kv[0] == "arm"]:
        trainer.update(by_name[name].trainer_fields())
    # Shallower paths first: ``optimizer: sophia`` then ``optimizer.lr`` keeps both.
    for path, value in sorted(settings, key=lambda kv: kv[0].count(".")):
        set_path(trainer, path, value)
    trainer["seed"] = seed
    faults = [f.model_copy(update={"seed": f.seed + seed}) for f in scenario.faults]
    if fault_mix is not None:
        drawn = fault_mix.draw(TrainerSpec.model_validate(trainer), seed)
        trainer["max_restarts"] = max(
            int(trainer.get("max_restarts", TrainerSpec.model_fields["max_restarts"].default)),
            fault_mix.restarts(drawn),
        )
        faults += drawn
    return scenario.model_copy(
        update={
            "name": f"{cell.slug}-seed{seed}",
            "trainer": TrainerSpec.model_validate(trainer),
            "faults": faults,
        }
    )


def _scenario(data: Any, source: str, lines: Mapping[Path_, int], out: Problems) -> Scenario | None:
    """The sweep's scenario, validated as a suite's would be (its lines and paths kept)."""
    if not isinstance(data, dict):
        out.add(("scenario",), "expected a mapping (trainer, faults, expect)")
        return None
    inner = {("scenarios", 0, *p[1:]): n for p, n in lines.items() if p[:1] == ("scenario",)}
    named = {"name": "run", **data}
    try:
        suite = parse_suite({"suite": "sweep", "scenarios": [named]}, source, inner)
    except ScenarioError as exc:
        out.problems += [p.replace(": scenarios[0]", ": scenario", 1) for p in exc.problems]
        return None
    return suite.scenarios[0]


def _grid(raw: Any, out: Problems, arms: bool) -> list[tuple[str, tuple[Any, ...]]]:
    if raw is None:
        return []
    if not isinstance(raw, dict):
        out.add(("grid",), "expected a mapping of trainer field -> list of values")
        return []
    grid = []
    for key, values in raw.items():
        where: Path_ = ("grid", str(key))
        path = str(key).removeprefix("trainer.")
        head = path.split(".")[0]
        if head not in TrainerSpec.model_fields:
            out.add(
                where,
                f"unknown trainer field {head!r}; expected one of "
                f"{', '.join(f for f in TrainerSpec.model_fields if f not in _NOT_SWEPT)}",
            )
            continue
        if head in _NOT_SWEPT:
            why = "the seeds are given by `seeds`" if head == "seed" else "it is no setting"
            out.add(where, f"{head} cannot be swept: {why}")
            continue
        if arms and head in ARM_FIELDS:
            out.add(where, f"{head} is set by the arms; sweep it as an arm")
            continue
        if not isinstance(values, list) or not values:
            out.add(where, "expected a non-empty list of values")
            continue
        if len({repr(v) for v in values}) < len(values):
            out.add(where, "lists a value twice")
            continue
        grid.append((path, tuple(values)))
    return grid


def _seeds(raw: Any, out: Problems) -> tuple[int, ...]:
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
        if raw > MAX_RUNS:  # checked before the seeds are made: 10**12 of them fill memory
            out.add(("seeds",), f"a count of {raw} seeds is past {MAX_RUNS} runs")
            return ()
        return tuple(range(raw))
    if (
        isinstance(raw, list)
        and raw
        and all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in raw)
    ):
        if len(set(raw)) < len(raw):
            out.add(("seeds",), "lists a seed twice")
        return tuple(raw)
    out.add(("seeds",), f"expected a count >= 1 or a list of seeds >= 0, got {raw!r}")
    return ()


def parse_sweep(data: Any, source: str, lines: Mapping[Path_, int] | None = None) -> Sweep:
    """Validate a sweep given as plain data (what the YAML file holds)."""
    lines = lines or {}
    out = Problems(source, lines)
    if not isinstance(data, dict):
        raise SweepError(source, [f"{source}: a sweep is a mapping with 'scenario' and 'grid'"])
    for key in sorted(set(data) - set(_KEYS)):
        out.add((str(key),), f"unknown key; a sweep has {', '.join(_KEYS)}")
    scenario = _scenario(data.get("scenario"), source, lines, out)
    arms = parse_arms(data.get("arms"), out)
    fault_mix = parse_fault_mix(data.get("fault_mix"), out)
    if arms and scenario is not None:
        for name in sorted(set(ARM_FIELDS) & scenario.trainer.model_fields_set):
            out.add(("scenario", "trainer", name), "set by the arms; leave it out of the trainer")
    grid = _grid(data.get("grid"), out, bool(arms))
    seeds = _seeds(data.get("seeds", 1), out)
    min_success = data.get("min_success")
    if min_success is not None and not (
        isinstance(min_success, int | float) and not isinstance(min_success, bool)
        and 0 <= min_success <= 1
    ):  # fmt: skip
        out.add(("min_success",), f"expected a success rate from 0 to 1, got {min_success!r}")
        min_success = None
    cells = max(1, len(arms))
    for _, values in grid:
        cells *= len(values)
    if cells * max(1, len(seeds)) > MAX_RUNS:
        out.add(("grid",), f"{cells} cells x {len(seeds)} seeds is past {MAX_RUNS} runs")
    sweep = None
    if scenario is not None and not out.problems:
        sweep = Sweep(
            name=str(data.get("sweep") or Path(source).stem),
            description=str(data.get("description") or ""),
            scenario=scenario,
            grid=tuple(grid),
            seeds=seeds,
            min_success=None if min_success is None else float(min_success),
            source=source,
            arms=arms,
            fault_mix=fault_mix,
        )
        _check_cells(sweep, out)
    if out.problems or sweep is None:
        raise SweepError(source, out.problems)
    return sweep


def _check_cells(sweep: Sweep, out: Problems) -> None:
    """Every cell must make a valid trainer; a bad value is named with its cell."""
    for cell in sweep.cells():
        try:
            sweep.run_scenario(cell, sweep.seeds[0])
        except ValidationError as exc:
            for err in exc.errors():
                where = ".".join(["trainer", *(str(p) for p in err["loc"])])
                msg = str(err["msg"]).removeprefix("Value error, ")
                out.add(("grid",), f"the cell {cell.label}: {where}: {msg}")
            if len(out.problems) >= 10:
                return


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file; every problem named with its file and line."""
    try:
        data, lines = read_yaml(path, "sweep")
    except ScenarioError as exc:
        raise SweepError(exc.source, exc.problems) from None
    return parse_sweep(data, str(path), lines)
