"""The JSON documents of ``--json``: ``list``, ``faults``, ``status`` and ``summary``.

Each command prints one JSON object on stdout and nothing else there (warnings go to
stderr). Every document starts with ``"format": "tightrope.<command>"`` and
``"version": 1``; a key is added in a later version, never renamed or removed without
raising the version. docs/json.md lists every key. As in the journal, a non-finite float
(a NaN loss) is written as the string ``"nan"``, ``"inf"`` or ``"-inf"``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from faults import FAULT_CLASSES, FaultSpec, kinds
from harness.records.journal import json_safe
from harness.records.status import JobStatus
from harness.records.summary import RunSummary
from harness.suites.scenario import Scenario, Suite

#: Version of every document below; raised when a key changes meaning or goes away.
JSON_VERSION = 1


def _head(command: str) -> dict[str, Any]:
    return {"format": f"tightrope.{command}", "version": JSON_VERSION}


def emit_json(document: dict[str, Any]) -> None:
    """Print ``document`` as one JSON object (indented, keys in the order built)."""
    json.dump(json_safe(document), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def suite_document(suite: Suite, chosen: Sequence[Scenario], path: Path) -> dict[str, Any]:
    """``tightrope list SUITE --json``: the suite and each chosen scenario."""
    return {
        **_head("list"),
        "suite": suite.name,
        "file": str(path),
        "scenarios": [
            {
                "name": s.name,
                "description": s.description,
                "class": s.scored_class,
                "faults": s.plan()["faults"],
                "checks": s.expect.checks(),
                "trainer": s.trainer.model_dump(mode="json"),
                "weight": s.weight,
                "crashpoints": s.crashpoints.model_dump(mode="json") if s.crashpoints else None,
            }
            for s in chosen
        ],
    }


def _default(value: object) -> Any:
    """A parameter's default as JSON: itself when JSON can hold it, else its text."""
    if value is PydanticUndefined:
        return None
    try:
        json.dumps(json_safe(value), allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value


def faults_document() -> dict[str, Any]:
    """``tightrope faults --json``: every fault kind, its class and own parameters."""
    common = [name for name in FaultSpec.model_fields if name != "kind"]
    order = {c: i for i, c in enumerate(FAULT_CLASSES)}
    every = sorted(kinds().values(), key=lambda k: (order.get(k.spec.fault_class, 99), k.name))
    return {
        **_head("faults"),
        "classes": list(FAULT_CLASSES),
        "common_parameters": common,
        "kinds": [
            {
                "name": kind.name,
                "class": kind.spec.fault_class,
                "description": kind.spec.description,
                "reach": kind.spec.reach,
                "triggers": list(kind.spec.triggers),
                "parameters": [
                    {
                        "name": name,
                        "required": field.default is PydanticUndefined
                        and field.default_factory is None,
                        "default": _default(field.default),
                    }
                    for name, field in kind.spec.model_fields.items()
                    if name not in FaultSpec.model_fields
                ],
            }
            for kind in every
        ],
    }


def status_document(state: JobStatus, run_dir: Path) -> dict[str, Any]:
    """``tightrope status RUN_DIR --json``: step, loss, armed, fired and refused faults."""
    return {**_head("status"), "run_dir": str(run_dir), **dataclasses.asdict(state)}


def summary_document(result: RunSummary, run_dir: Path, warnings: Sequence[str]) -> dict[str, Any]:
    """``tightrope summary RUN_DIR --json``: the run's account, with the derived figures."""
    fields = dataclasses.asdict(result)
    fields["loss_by_step"] = [[step, loss] for step, loss in result.loss_by_step]
    return {
        **_head("summary"),
        "run_dir": str(run_dir),
        "verdict": result.verdict(),
        **fields,
        "attempts": result.attempts,
        "tokens_per_second": result.tokens_per_second,
        "loss_ratio": result.loss_ratio(),
        "warnings": list(warnings),
    }
