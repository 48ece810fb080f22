"""Read a suite file: YAML (``safe_load`` only) -> defaults merged -> validated `Suite`.

Every problem found is reported at once, each as ``FILE:LINE: dotted.path: what was
expected``, in one `ScenarioError`; nothing runs until the whole file is valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from faults import FaultSpec, kinds, yaml_input
from harness.errors import TightropeError
from harness.suites.crashpoints_spec import CrashpointsSpec
from harness.suites.scenario import Expect, Scenario, Suite, SuiteDefaults, TrainerSpec

Path_ = tuple[str | int, ...]

_SUITE_KEYS = {"suite", "description", "defaults", "scenarios"}
#: A scenario's blocks whose unknown fields are named with the fields they have.
_BLOCKS: dict[str, type[Any]] = {"trainer": TrainerSpec, "crashpoints": CrashpointsSpec}


class ScenarioError(TightropeError):
    """A suite file is unreadable or invalid; ``problems`` holds one line per problem."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        head = f"{source}: {len(problems)} problem(s)" if len(problems) > 1 else ""
        super().__init__("\n".join([head, *problems]) if head else problems[0])


def dotted(path: Path_) -> str:
    """``("scenarios", 0, "expect", "mttr")`` -> ``scenarios[0].expect.mttr``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _lines(
    node: yaml.Node, path: Path_ = (), into: dict[Path_, int] | None = None
) -> dict[Path_, int]:
    """Line (1-based) of every mapping key and sequence item in a composed YAML tree."""
    into = {} if into is None else into
    into.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = (*path, str(key.value))
            into[sub] = key.start_mark.line + 1
            _lines(value, sub, into)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), into)
    return into


class Problems:
    """Gathers problems with the line of the nearest known enclosing path."""

    def __init__(self, source: str, lines: Mapping[Path_, int]) -> None:
        self.source, self.lines = source, lines
        self.problems: list[str] = []

    def add(self, path: Path_, message: str) -> None:
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        where = f"{self.source}:{line}" if line else self.source
        self.problems.append(f"{where}: {dotted(path) or '(top level)'}: {message}")

    def add_validation(self, base: Path_, exc: ValidationError, model: type[Any]) -> None:
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
            self.add((*base, *loc), _explain(err, loc, model))


def _explain(err: Any, loc: Path_, model: type[Any]) -> str:
    """pydantic's message, made specific where a user most often trips."""
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        field = loc[-1] if loc else "?"
        if model is Scenario and len(loc) == 2 and loc[0] == "expect":
            return f"unknown check {field!r}; expected one of {', '.join(Expect.model_fields)}"
        if model is Scenario and len(loc) == 2 and loc[0] in _BLOCKS:
            return (
                f"unknown {loc[0]} field {field!r}; expected one of "
                f"{', '.join(_BLOCKS[str(loc[0])].model_fields)}"
            )
        return f"unknown field {field!r}"
    if loc and "input" in err and err["type"] != "missing":
        msg += f" (got {err['input']!r})"
    return msg


def _merge(defaults: dict[str, Any], own: Any) -> Any:
    """A scenario's mapping over the suite default's; a key set to null drops the default."""
    if not isinstance(own, dict):
        return own if own is not None else dict(defaults)
    merged = {**defaults, **own}
    return {k: v for k, v in merged.items() if v is not None}


def _parse_faults(raw: Any, base: Path_, out: Problems) -> list[FaultSpec] | None:
    if raw is None:
        return []
    if not isinstance(raw, list):
        out.add(base, f"expected a list of faults, got {type(raw).__name__}")
        return None
    table, specs, ok = kinds(), [], True
    for j, item in enumerate(raw):
        where = (*base, j)
        if not isinstance(item, dict):
            out.add(where, "expected a mapping with a 'kind'")
            ok = False
            continue
        kind = item.get("kind")
        if kind not in table:
            out.add((*where, "kind"), f"unknown fault kind {kind!r}; see `tightrope faults`")
            ok = False
            continue
        try:
            specs.append(table[kind].spec.model_validate(item))
        except ValidationError as exc:
            out.add_validation(where, exc, table[kind].spec)
            ok = False
    return specs if ok else None


#: What a scenario with a ``crashpoints:`` block does not take: its block names the job.
_NOT_WITH_CRASHPOINTS = ("trainer", "faults", "expect")


def _add_crashpoints(
    item: dict[str, Any], base: Path_, out: Problems, into: list[Scenario]
) -> None:
    """A crash-point scenario (`harness.suites.crashpoints_spec`): the suite's default
    trainer and checks do not apply to it; its own ``trainer``, ``faults`` or ``expect`` is
    an error."""
    wrong = [key for key in _NOT_WITH_CRASHPOINTS if key in item]
    for key in wrong:
        out.add(
            (*base, key),
            "not with crashpoints: the block names the job's command, and its points are "
            "its checks",
        )
    if wrong:
        return
    try:
        into.append(Scenario.model_validate(item))
    except ValidationError as exc:
        out.add_validation(base, exc, Scenario)


def parse_suite(data: Any, source: str, lines: Mapping[Path_, int] | None = None) -> Suite:
    """Validate a suite given as plain data (what the YAML file holds)."""
    out = Problems(source, lines or {})
    if not isinstance(data, dict):
        raise ScenarioError(source, [f"{source}: a suite is a mapping with 'scenarios'"])
    for key in sorted(set(data) - _SUITE_KEYS):
        out.add((key,), f"unknown key; a suite has {', '.join(sorted(_SUITE_KEYS))}")
    try:
        defaults = SuiteDefaults.model_validate(data.get("defaults") or {})
    except ValidationError as exc:
        out.add_validation(("defaults",), exc, SuiteDefaults)
        defaults = SuiteDefaults()
    raw = data.get("scenarios")
    if not isinstance(raw, list) or not raw:
        out.add(("scenarios",), "expected a non-empty list of scenarios")
        raw = []
    scenarios: list[Scenario] = []
    for i, item in enumerate(raw):
        base: Path_ = ("scenarios", i)
        if not isinstance(item, dict):
            out.add(base, "expected a mapping (name, trainer, faults, expect)")
            continue
        if "crashpoints" in item:
            _add_crashpoints(item, base, out, scenarios)
            continue
        faults = _parse_faults(item.get("faults"), (*base, "faults"), out)
        merged = {
            **item,
            "trainer": _merge(defaults.trainer, item.get("trainer")),
            "expect": _merge(defaults.expect, item.get("expect")),
            "faults": faults or [],
        }
        if "weight" not in item and defaults.weight is not None:
            merged["weight"] = defaults.weight
        if faults is None:
            continue
        try:
            scenarios.append(Scenario.model_validate(merged))
        except ValidationError as exc:
            out.add_validation(base, exc, Scenario)
    if not out.problems:
        try:
            return Suite(
                name=str(data.get("suite") or Path(source).stem),
                description=str(data.get("description") or ""),
                scenarios=scenarios,
                source=source,
            )
        except ValidationError as exc:
            out.add_validation((), exc, Suite)
    raise ScenarioError(source, out.problems)


def read_yaml(path: str | Path, what: str = "suite") -> tuple[Any, dict[Path_, int]]:
    """A YAML file's data and the line of each of its keys; `ScenarioError` names the file
    (and line) when it cannot be read or parsed."""
    path = Path(path)
    source = str(path)
    try:
        text = yaml_input.read_text(path, what)
    except OSError as exc:
        raise ScenarioError(source, [f"cannot read {what} {source}: {exc.strerror}"]) from exc
    except yaml_input.YamlInputError as exc:
        raise ScenarioError(source, [str(exc)]) from None
    try:
        # Counted before anything walks it: the line map below expands aliases too.
        data = yaml_input.load(text, source)
        node = yaml_input.compose(text, source)
    except yaml_input.YamlInputError as exc:
        raise ScenarioError(source, [str(exc)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(source, [f"{where}: not valid YAML: {problem}"]) from None
    return data, (_lines(node) if node is not None else {})


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file; every problem named with its file and line."""
    data, lines = read_yaml(path)
    return parse_suite(data, str(path), lines)
