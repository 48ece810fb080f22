"""A fault plan: the list of faults to inject into one run, read from YAML or a mapping.

```yaml
faults:
  - kind: nan_grad
    at_step: 30
    ranks: [1]
    target: "blocks.0.attn.*"
```
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from faults.errors import FaultSpecError
from faults.registry import parse_fault
from faults.spec import FaultSpec
from faults.yaml_input import YamlInputError, load, read_text


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Faults to inject, in order; empty means a fault-free run."""

    faults: tuple[FaultSpec, ...] = ()

    def __iter__(self) -> Iterator[FaultSpec]:
        return iter(self.faults)

    def __len__(self) -> int:
        return len(self.faults)

    @classmethod
    def from_dict(cls, data: Any, where: str = "plan") -> FaultPlan:
        """Validate ``{"faults": [...]}`` (or a bare list of faults)."""
        if isinstance(data, dict):
            unknown = set(data) - {"faults"}
            if unknown:
                raise FaultSpecError(
                    f"{where}: unknown key(s) {', '.join(sorted(unknown))}; a plan has 'faults'"
                )
            data = data.get("faults", [])
            where = f"{where}.faults"
        if not isinstance(data, list):
            raise FaultSpecError(f"{where} must be a list of faults, got {type(data).__name__}")
        return cls(tuple(parse_fault(item, f"{where}[{i}]") for i, item in enumerate(data)))

    def problems(
        self, steps: int, world_size: int, names: tuple[str, str] = ("--steps", "WORLD_SIZE")
    ) -> list[str]:
        """What keeps this plan from meeting a run of ``steps`` steps on ``world_size``
        ranks: a fault that would never fire, or that targets only ranks the job lacks
        (``names`` say what the two numbers are called where they were given). The suite
        loader and the reference trainer's ``--fault-plan`` both ask."""
        found = []
        for i, fault in enumerate(self.faults):
            first = fault.at_step if fault.at_step is not None else fault.every
            if first is not None and first > steps:
                found.append(
                    f"faults[{i}] ({fault.kind}) fires at step {first}, past {names[0]} "
                    f"{steps}: it would never fire"
                )
            if isinstance(fault.ranks, list) and fault.ranks and min(fault.ranks) >= world_size:
                found.append(
                    f"faults[{i}] ({fault.kind}) targets ranks {fault.ranks}, but {names[1]} "
                    f"is {world_size}"
                )
        return found

    @classmethod
    def from_yaml(cls, path: str | Path) -> FaultPlan:
        """Read a plan file; errors name the file and the dotted field."""
        path = Path(path)
        try:
            data = load(read_text(path, "fault plan"), str(path))
        except OSError as exc:
            raise FaultSpecError(f"cannot read fault plan {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise FaultSpecError(f"{path}: not valid YAML: {exc}") from exc
        except YamlInputError as exc:
            raise FaultSpecError(str(exc)) from None
        return cls.from_dict(data if data is not None else {}, where=str(path))

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (what ``from_dict`` reads)."""
        return {"faults": [f.model_dump(mode="json") for f in self.faults]}
