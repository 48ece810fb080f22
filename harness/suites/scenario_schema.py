"""The JSON Schema of a suite file, for editors (`tightrope schema`).

The models validate a scenario after the suite's defaults are merged in; in the file
itself ``trainer`` and ``expect`` may come from ``defaults``, and each fault is one of
the registered kinds, told apart by ``kind``.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter

from faults import kinds
from harness.suites.scenario import Expect, Scenario, SuiteDefaults, TrainerSpec


def suite_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a suite file."""
    specs = tuple(k.spec for k in kinds().values())
    fault = Annotated[Union[specs], Field(discriminator="kind")]  # type: ignore[valid-type]  # noqa: UP007
    fault_schema = TypeAdapter(fault).json_schema(ref_template="#/$defs/{model}")
    defs: dict[str, Any] = dict(fault_schema.pop("$defs", {}))
    for model in (TrainerSpec, Expect, Scenario, SuiteDefaults):
        schema = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
        defs.update(schema.pop("$defs", {}))
        defs[model.__name__] = schema
    defs.pop("FaultSpec", None)  # replaced by the union of kinds below
    scenario = defs["Scenario"]
    scenario["properties"]["faults"] = {"type": "array", "items": fault_schema}
    scenario["required"] = ["name"]  # trainer and expect may come from the defaults
    defaults = defs["SuiteDefaults"]["properties"]
    defaults["trainer"] = {"$ref": "#/$defs/TrainerSpec"}
    defaults["expect"] = {"$ref": "#/$defs/Expect"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tightrope suite",
        "type": "object",
        "additionalProperties": False,
        "required": ["scenarios"],
        "properties": {
            "suite": {"type": "string", "description": "Name of the suite."},
            "description": {"type": "string"},
            "defaults": {"$ref": "#/$defs/SuiteDefaults"},
            "scenarios": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/Scenario"}},
        },
        "$defs": defs,
    }
